"""Compiles every hand-written Triton kernel of the product ahead of time for the GPUs it runs on
(A100: sm_80, H100/H200: sm_90), with no GPU: Triton's front end, its lowering and ptxas (in the
triton wheel). A kernel that does not compile for a GPU fails here on any CPU machine, not in a
user's first GPU run. What it computes is tested elsewhere, through Triton's interpreter.

    python tests/moss/kernels_for_gpus.py            # prints one line per kernel and GPU

Run as a script, in a process of its own: importing triton in a test process before
TRITON_INTERPRET is set would make the interpreter tests skip.

Each kernel is compiled with the argument types and compile-time values of a real call (the
MOSS-Audio-Tokenizer-v2 decoder's shapes, bf16 as on the production path, and fp32 where a
kernel has a float32 variant); the signatures are written out here, so a kernel whose parameters
change fails until this table follows it.
"""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bestofn.backends.sidon import kernels as sidon
from bestofn.moss import decode_kernel
from bestofn.moss.codec import kernels as codec

TARGETS = {
    "sm_80 (A100)": GPUTarget("cuda", 80, 32),
    "sm_90 (H100, H200)": GPUTarget("cuda", 90, 32),
}
C = "constexpr"


def _attention(name: str, fn, extra: dict) -> list:
    sig = {**extra, "H": C, "DH": C, "DH_P2": C, "F32_DOTS": C, "BLOCK_M": C, "BLOCK_N": C,
           "TILES": C}  # fmt: skip
    opts = dict(num_warps=codec.ATTN_WARPS, num_stages=codec.ATTN_STAGES)
    rows = []
    for dtype, f32 in (("bf16", False), ("fp32", True)):
        typed = {k: (f"*{dtype}" if v == "*T" else v) for k, v in sig.items()}
        consts = dict(H=12, DH=64, DH_P2=64, F32_DOTS=f32, BLOCK_M=codec.ATTN_BLOCK_M,
                      BLOCK_N=codec.ATTN_BLOCK_N, TILES=15)  # fmt: skip
        rows.append((f"{name} {dtype}", fn, typed, consts, opts))
    return rows


def cases() -> list:
    """(name, kernel, signature, compile-time values, options) for every kernel."""
    out = []
    for dtype in ("bf16", "fp32"):
        t = f"*{dtype}"
        out.append((f"heads_rope {dtype}", codec._heads_rope_kernel,
                    {"qkv": t, "cos": "*fp32", "sin": "*fp32", "out": t, "T": "i32", "Tp": "i32",
                     "H": C, "DH": C, "DH_P2": C, "ROPE": C, "BLOCK": C},
                    dict(H=12, DH=64, DH_P2=64, ROPE=True, BLOCK=codec.BLOCK_T), {}))  # fmt: skip
        out.append((f"ring_heads {dtype}", codec._ring_heads_kernel,
                    {"qkv": t, "cos": "*fp32", "sin": "*fp32", "dest": "*i64", "q_out": t,
                     "ring_k": t, "ring_v": t, "rows": "i32", "N": "i32",
                     "H": C, "DH": C, "DH_P2": C, "ROPE": C, "BLOCK": C},
                    dict(H=20, DH=64, DH_P2=64, ROPE=True, BLOCK=codec.BLOCK_T), {}))  # fmt: skip
        out.append((f"residual_layer_norm {dtype}", codec._residual_norm_kernel,
                    {"x": t, "u": t, "scale": t, "w": t, "b": t, "new_x": t, "normed": t,
                     "rows": "i32", "eps": "fp32", "D": C, "BLOCK_D": C, "ROWS": C, "SCALE": C},
                    dict(D=1280, BLOCK_D=2048, ROWS=2, SCALE=True),
                    dict(num_warps=codec.NORM_WARPS)))  # fmt: skip
    out += _attention("window_attention", codec._window_attention_kernel,
                      {"q": "*T", "k": "*T", "v": "*T", "out": "*T", "T": "i32", "Tq": "i32",
                       "window": "i32", "qk_scale": "fp32"})  # fmt: skip
    out += _attention("ring_attention", codec._ring_attention_kernel,
                      {"q": "*T", "ring_k": "*T", "ring_v": "*T", "slots": "*i64",
                       "pos": "*i64", "out": "*T", "N": "i32", "R": "i32", "window": "i32",
                       "qk_scale": "fp32"})  # fmt: skip
    built = decode_kernel._build()
    strides = {f"s{n}": "i32" for n in ("q_b", "q_h", "q_g", "k_b", "k_h", "k_l", "v_b", "v_h",
                                         "v_l", "bias_b")}  # fmt: skip
    for dtype, ieee in (("bf16", False), ("fp32", True)):
        t = f"*{dtype}"
        out.append((f"decode attention partial {dtype}", built["partial"],
                    {"q_ptr": t, "k_ptr": t, "v_ptr": t, "bias_ptr": t, "m_ptr": "*fp32",
                     "l_ptr": "*fp32", "o_ptr": "*fp32", **strides, "L": "i32", "KV": "i32",
                     "scale": "fp32", "S": C, "G": C, "GP": C, "D": C, "BLOCK": C, "IEEE": C},
                    dict(S=16, G=4, GP=16, D=128, BLOCK=decode_kernel.BLOCK_N, IEEE=ieee),
                    {}))  # fmt: skip
    out.append(("decode attention merge", built["merge"],
                {"m_ptr": "*fp32", "l_ptr": "*fp32", "o_ptr": "*fp32", "out_ptr": "*bf16",
                 "so_b": "i32", "so_h": "i32", "so_g": "i32", "KV": "i32",
                 "S": C, "G": C, "GP": C, "D": C},
                dict(S=16, G=4, GP=16, D=128), {}))  # fmt: skip
    snake = sidon._triton_kernels()
    for cl in (False, True):
        out.append((f"sidon snake {'channels last' if cl else '[B, C, T]'}", snake["snake"],
                    {"x_ptr": "*bf16", "bias_ptr": "*bf16", "alpha_ptr": "*fp32",
                     "y_ptr": "*bf16", "T": "i32", "C": "i32", "HAS_BIAS": C, "CL": C,
                     "BLOCK": C},
                    dict(HAS_BIAS=True, CL=cl, BLOCK=sidon._BLOCK), {}))  # fmt: skip
        out.append((f"sidon residual {'channels last' if cl else '[B, C, T]'}",
                    snake["residual"],
                    {"x_ptr": "*bf16", "xb_ptr": "*bf16", "c_ptr": "*bf16", "cb_ptr": "*bf16",
                     "y_ptr": "*bf16", "T": "i32", "C": "i32", "X_BIAS": C, "CL": C, "BLOCK": C},
                    dict(X_BIAS=True, CL=cl, BLOCK=sidon._BLOCK), {}))  # fmt: skip
    return out


def main() -> int:
    failed = 0
    for gpu, target in TARGETS.items():
        for name, fn, sig, consts, opts in cases():
            try:
                k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                                   target=target, options=opts)  # fmt: skip
                print(f"ok {gpu}: {name} ({len(k.asm['cubin'])} bytes of cubin)")
            except Exception as e:  # the kernel's name and the GPU, then the compiler's words
                failed += 1
                print(f"FAILED {gpu}: {name}: {type(e).__name__}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
