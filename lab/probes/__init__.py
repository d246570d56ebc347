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
speech_profile.py          the speech service's render by part (decode loop, codec, the rest)
stream_codec.py            the service's streaming codec decode against the one-shot decode
speaker_tolerance.py       how far wavlm-speaker's speed paths move spk_sim
"""

import json


def write_rows(path, rows: list[dict]) -> None:
    """A probe's rows as JSON lines at ``path`` (its ``--out``)."""
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
