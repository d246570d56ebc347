"""Sidon's fused decoder kernels on CUDA (Triton), and the state of one restorer's choice of
them: ``DecoderKernels`` (one per restorer, never module-global, so two restorers in one
process, as `bestofn ab` and `bench pipeline` build them, each run their own path).

Snake on CUDA in one pass. Eagerly it is five elementwise kernels over the decoder's largest
tensors (48 channels at 48 kHz), each reading and writing the whole tensor, in float32 (the
float32 alpha promotes the autocast conv output). Every Snake feeds a convolution, which under
autocast reads it in the autocast dtype: the fused kernel computes the same float32 sequence
and writes that dtype directly. ``snake``: eager, fused, or auto (fused where Triton imports).

On CUDA, torch runs a convolution's bias as a separate broadcast add over the output (cuDNN
computes the convolution without it): 37 such adds per decoder pass, 20 % of Sidon's GPU time
once Snake was fused (an H200 profile). Where Snake runs fused, the decoder therefore
calls its convolutions without bias and hands the bias to the kernel that reads the output
next: a Snake, or a residual unit's sum. The kernels round conv + bias to the conv's output
dtype first, as the separate add does, so the output is bit for bit the same.

The layout (default channels_last): a 1-D convolution on [B, C, T] makes cuDNN transpose its
input to NHWC and its output back, around kernels that work in NHWC (15 % of Sidon's GPU
time). Channels last, the decoder keeps [B, C, 1, T] tensors stored as [B, T, C] from its
input (the encoder's output, transposed, is that layout already) to its output, and runs the
equal 2-D convolutions. cuDNN then picks other kernels, so the output differs from nchw's in
the last fp16 bits (max |diff| 4.9e-4 on an H200); nchw is bit for bit eager."""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger("bestofn.backends.sidon")

SNAKE_MODES = ("auto", "fused", "eager")
LAYOUTS = ("nchw", "channels_last")
DEFAULT_SNAKE = "auto"  # the restorer's runtime.snake default
DEFAULT_LAYOUT = "channels_last"  # the restorer's runtime.layout default
_BLOCK = 1024


def check_snake(mode: str) -> str:
    if mode not in SNAKE_MODES:
        raise ValueError(f"sidon: snake must be auto, fused or eager; got {mode!r}")
    return mode


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"sidon: layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    return layout


def _triton_kernels() -> dict:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    # Both kernels read [B, C, T] (one program row per batch x channel, blocks along T) or,
    # with CL, channels last ([B, C, 1, T] stored as [B, T, C]; T is then the element count
    # and the channel is the fastest index). A bias is rounded to the tensor's dtype, and
    # tensor + bias rounded again, as autocast and torch's separate bias add round them.

    @triton.jit
    def snake(x_ptr, bias_ptr, alpha_ptr, y_ptr, T, C, HAS_BIAS: tl.constexpr,
              CL: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        if CL:
            offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < T
            channel = offsets % C
            a = tl.load(alpha_ptr + channel, mask=mask, other=1.0).to(tl.float32)
            b = tl.load(bias_ptr + channel, mask=mask, other=0.0)
        else:
            row = tl.program_id(0)  # batch * C + channel
            cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            mask = cols < T
            offsets = row.to(tl.int64) * T + cols
            a = tl.load(alpha_ptr + row % C).to(tl.float32)
            b = tl.load(bias_ptr + row % C)
        x = tl.load(x_ptr + offsets, mask=mask)
        if HAS_BIAS:
            x = (x.to(tl.float32) + b.to(x.dtype).to(tl.float32)).to(x.dtype)
        x = x.to(tl.float32)
        s = libdevice.sin(a * x)  # CUDA's sinf, as torch.sin; not sin.approx
        y = x + libdevice.div_rn(1.0, a + 1e-9) * (s * s)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def residual(x_ptr, xb_ptr, c_ptr, cb_ptr, y_ptr, T, C, X_BIAS: tl.constexpr,
                 CL: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        if CL:
            offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < T
            channel = offsets % C
            xb = tl.load(xb_ptr + channel, mask=mask, other=0.0)
            cb = tl.load(cb_ptr + channel, mask=mask, other=0.0)
        else:
            row = tl.program_id(0)
            cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            mask = cols < T
            offsets = row.to(tl.int64) * T + cols
            xb = tl.load(xb_ptr + row % C)
            cb = tl.load(cb_ptr + row % C)
        x = tl.load(x_ptr + offsets, mask=mask)
        if X_BIAS:
            x = (x.to(tl.float32) + xb.to(x.dtype).to(tl.float32)).to(x.dtype)
        c = tl.load(c_ptr + offsets, mask=mask)
        c = (c.to(tl.float32) + cb.to(c.dtype).to(tl.float32)).to(c.dtype)
        y = x.to(tl.float32) + c.to(tl.float32)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)

    return {"snake": snake, "residual": residual}


def _launch(x: torch.Tensor) -> tuple[tuple, dict, int, int]:
    """(grid, layout flags, T, C) for a [B, C, T] or channels-last [B, C, 1, T] tensor."""
    if x.dim() == 4:
        n, channels = x.numel(), x.shape[1]
        return (-(-n // _BLOCK), 1), {"CL": True}, n, channels
    batch, channels, length = x.shape
    return (batch * channels, -(-length // _BLOCK)), {"CL": False}, length, channels


def dense(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x.contiguous()


class DecoderKernels:
    """Which decoder code one restorer runs, and its compiled Triton kernels.

    ``kernel``: None until first asked (Triton is imported then), the kernel table once
    compiled, False where Triton is absent or failed here (the eager ops from then on).
    ``fuse_bias`` False fuses Snake alone (kept for side-by-side benchmarks)."""

    def __init__(self, snake: str = DEFAULT_SNAKE, layout: str = DEFAULT_LAYOUT):
        self.mode = check_snake(snake)
        self.layout = check_layout(layout)
        self.fuse_bias = True
        self.kernel: dict | bool | None = None

    def set_snake(self, mode: str) -> None:
        self.mode = check_snake(mode)

    def set_layout(self, layout: str) -> None:
        """The fused decoder's activation layout: nchw ([B, C, T], as eager) or channels_last."""
        self.layout = check_layout(layout)

    def fused(self) -> bool:
        """Whether the fused Snake runs (compiling the kernels on the first call)."""
        if self.mode == "eager":
            return False
        if self.kernel is None:
            try:
                self.kernel = _triton_kernels()
            except ImportError as e:
                if self.mode == "fused":
                    raise RuntimeError(f"sidon: snake=fused needs Triton ({e})") from e
                self.kernel = False
        return bool(self.kernel)

    def failed(self, e: Exception) -> None:
        """The fused kernels failed here (e.g. a GPU Triton cannot compile for): raise under
        snake=fused, else warn and use the eager ops from now on."""
        if self.mode == "fused":
            raise e
        log.warning("sidon: fused Snake failed here (%s); eager Snake from now on", e)
        self.kernel = False

    def describe(self, device: str) -> str:
        """The decoder code a restorer on ``device`` runs (it changes the output's last bits:
        channels last uses other cuDNN kernels), for provenance."""
        if not str(device).startswith("cuda") or not self.fused():
            return "eager"
        if not self.fuse_bias:
            return "fused snake"
        return f"fused snake + conv bias, {self.layout}"

    def snake(self, x: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor | None = None):
        """Snake1d's value of ``x`` (+ ``bias`` per channel, rounded to x's dtype first),
        written in the dtype the next (autocast) convolution reads; [B, C, T] or channels
        last."""
        if torch.is_autocast_enabled("cuda"):
            out_dtype = torch.get_autocast_dtype("cuda")
        else:
            out_dtype = torch.promote_types(x.dtype, alpha.dtype)
        x = dense(x)
        y = torch.empty_like(x, dtype=out_dtype)
        grid, layout, length, channels = _launch(x)
        self.kernel["snake"][grid](
            x, x if bias is None else bias, alpha.reshape(-1).contiguous(), y, length, channels,
            HAS_BIAS=bias is not None, BLOCK=_BLOCK, **layout,
        )  # fmt: skip
        return y

    def residual(self, x, x_bias, conv_out, conv_bias) -> torch.Tensor:
        """(x + x_bias) + (conv_out + conv_bias), each sum rounded as eager rounds it: a
        residual unit's output where neither bias has been added yet (x_bias may be None)."""
        x, conv_out = dense(x), dense(conv_out)
        y = torch.empty_like(x, dtype=torch.promote_types(x.dtype, conv_out.dtype))
        grid, layout, length, channels = _launch(x)
        self.kernel["residual"][grid](
            x, x if x_bias is None else x_bias, conv_out, conv_bias, y, length, channels,
            X_BIAS=x_bias is not None, BLOCK=_BLOCK, **layout,
        )  # fmt: skip
        return y


def _weight_2d(conv: nn.Module) -> torch.Tensor:
    """The conv's weight as a [.., .., 1, k] channels-last 2-D kernel, made once."""
    w = conv.weight
    key = (w.data_ptr(), w._version, w.dtype, w.device)
    cached = getattr(conv, "_weight_2d", None)
    if cached is None or cached[0] != key:
        cached = (key, w.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last))
        conv._weight_2d = cached
    return cached[1]


def conv_without_bias(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` minus its bias (the fused path adds it in the next kernel). A 4-D ``x`` is
    channels last ([B, C, 1, T]): the conv runs as the equal 2-D one, so cuDNN's NHWC kernels
    read and write it without the NCHW<->NHWC transposes it adds around a 1-D conv."""
    if x.dim() == 4:
        if isinstance(conv, nn.ConvTranspose1d):
            return nn.functional.conv_transpose2d(
                x, _weight_2d(conv), None, (1, *conv.stride), (0, *conv.padding),
                (0, *conv.output_padding), conv.groups, (1, *conv.dilation),
            )  # fmt: skip
        return nn.functional.conv2d(
            x, _weight_2d(conv), None, (1, *conv.stride), (0, *conv.padding),
            (1, *conv.dilation), conv.groups,
        )  # fmt: skip
    if isinstance(conv, nn.ConvTranspose1d):
        return nn.functional.conv_transpose1d(
            x, conv.weight, None, conv.stride, conv.padding, conv.output_padding, conv.groups,
            conv.dilation,
        )  # fmt: skip
    return conv._conv_forward(x, conv.weight, None)
