"""Int8 weight-only backbone weights for moss-fast (option ``weights: int8``): a memory dial.

Each backbone Linear weight (fused qkv, o_proj, fused gate_up, down_proj of every layer) is
quantized once at load, symmetrically per output channel: ``scale = max|w_row| / 127``,
``q = round(w / scale)`` in [-127, 127]. What stays resident is the int8 matrix plus one scale per
output channel in the model dtype: about half the bytes of bf16 weights (0.5 + 1/in_features).

Dequantized on the fly, not at load: dequantizing at load would keep the audio change and
give back none of the memory. ``Int8Linear.weight`` is a property that rebuilds the weight in
the model dtype when the layer runs, so the per-token pieces of ``bestofn.moss.model`` (pure
functions taking weight tensors, compiled and CUDA-graph captured as they are) run unchanged;
the transient full-precision copy lives only for that one layer's matmul. The price is one
dequantize kernel per Linear per step (extra memory traffic): on a GPU this is a memory dial,
not a speed dial; `bestofn ab` measures both (ledger figures serve.int8.peak_memory and
serve.int8_cap.rtf_c1).

The local transformer, the embeddings and the heads stay in the model dtype (small, or tied to
the codebook embeddings).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The backbone's Linear layers, by attribute name on bestofn.moss.model.BackboneLayer.
BACKBONE_LINEARS = ("qkv", "o_proj", "gate_up", "down_proj")
WEIGHTS = ("dtype", "int8")  # option values: as the 'dtype' option says, or int8 weight-only


@torch.no_grad()
def quantize_per_channel(weight: torch.Tensor, scale_dtype: torch.dtype | None = None):
    """(int8 weight [out, in], scale [out] in ``scale_dtype``; default the weight's dtype).

    The rounding uses the scale as stored, so dequantization error is only the rounding's."""
    w = weight.detach().to(torch.float32)
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    scale = scale.to(scale_dtype or weight.dtype)
    q = torch.round(w / scale.to(torch.float32)[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """A bias-free Linear holding an int8 weight and per-output-channel scales."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2 or scale.shape != qweight.shape[:1]:
            raise ValueError(
                f"Int8Linear: want an int8 [out, in] weight and [out] scales, got "
                f"{qweight.dtype} {tuple(qweight.shape)} and {tuple(scale.shape)}"
            )
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.in_features, self.out_features = qweight.shape[1], qweight.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear, device=None) -> Int8Linear:
        if linear.bias is not None:
            raise ValueError("Int8Linear: the backbone's Linear layers have no bias")
        w = linear.weight if device is None else linear.weight.to(device)
        return cls(*quantize_per_channel(w))

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight in the scales' dtype (built on each access, not kept)."""
        return self.qweight.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x @ (q * s)^T == (x @ q^T) * s: the scale applies to the output channels.
        return F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scale))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def is_quantized(model) -> bool:
    return any(isinstance(getattr(layer, "qkv", None), Int8Linear) for layer in model.layers)


@torch.no_grad()
def quantize_backbone_(model, device=None):
    """Replace the backbone's Linear layers of ``model`` with Int8Linear, in place; then move
    the model to ``device`` (when given). Each weight is quantized on ``device``, one at a
    time, so a model loaded on the CPU reaches the GPU without ever being whole there in full
    precision. Returns the model."""
    for layer in model.layers:
        for name in BACKBONE_LINEARS:
            linear = getattr(layer, name)
            if isinstance(linear, Int8Linear):
                continue
            setattr(layer, name, Int8Linear.from_linear(linear, device))
            del linear
    if device is not None:
        model.to(device)
    return model


def linear_bytes(model) -> int:
    """Bytes of the backbone's Linear weights as they are held (int8 + scales, or full)."""
    total = 0
    for layer in model.layers:
        for name in BACKBONE_LINEARS:
            m = getattr(layer, name)
            if isinstance(m, Int8Linear):
                total += m.nbytes()
            else:
                total += m.weight.numel() * m.weight.element_size()
    return total
