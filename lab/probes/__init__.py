"""Measurements behind single figures of docs/PERFORMANCE.md, each run as
``python -m lab.probes.NAME`` from the repository root (the docs/bench/*_gpu.sh scripts
call them on a device):

parakeet_profile.py        Parakeet's encoder and decoder apart, at random and at a declared
                           speech-rate emission
parakeet_encoder_probe.py  Parakeet's encoder knobs (SDPA, bf16 weights, cudnn.benchmark)
stage_profile.py           torch.profiler kernel tables of Sidon and Parakeet
delay_bench.py             MOSS-TTS Delay 8B: moss-fast vs the published generate
delay_profile.py           where a Delay decode step spends its time
gemm_probe.py              the Local frame step's GEMM shapes alone, bf16 vs fp8
triton_gemm_probe.py       a split-K Triton GEMM on those shapes (research only)
decode_kernel_check.py     the split-K decode attention kernel against SDPA, alone
worker_start.py            a production worker's start: imports, each backend's load, warm-up,
                           ready, the first group (serial / cold / warm compile cache)
"""
