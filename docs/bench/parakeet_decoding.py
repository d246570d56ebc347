"""Parakeet's whole ASR through the product's scorer (registry build, ParakeetScorer.transcribe)
on 64 speech-like 15-s clips, batch 64, in one decoding per process: s/clip, median of N, and a
hash of the transcripts (two decodings must give the same one).

    python docs/bench/parakeet_decoding.py CONFIG DECODING N
    (CONFIG: the config `bestofn fake-weights --parakeet calibrated` wrote; DECODING:
    cuda_graphs, cuda_graphs_host_loop, ...; one process per DECODING)
"""

import hashlib
import json
import statistics
import sys
import time

import torch
import yaml

from bestofn.backends.registry import build
from lab.bench.scorers import clips

cfg, decoding, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
scorers = yaml.safe_load(open(cfg))["models"]["scorers"]
entry = next(s for s in scorers if s["backend"] == "parakeet")
opts = {**entry.get("options", {}), **entry.get("runtime", {})}
opts.update(batch_size=64, decoding=decoding)
scorer = build("scorer", "parakeet", opts, device="cuda")
audio = clips(64, 15.0, 16000)
first = scorer.transcribe(audio, 16000)
times = []
for _ in range(repeats):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    texts = scorer.transcribe(audio, 16000)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
mode = getattr(scorer.model.decoding.decoding.decoding_computer, "cuda_graphs_mode", None)
print(
    json.dumps(
        {
            "decoding": decoding,
            "nemo_mode": str(mode),
            "s_per_clip_median": statistics.median(times) / 64,
            "s_per_clip_all": [t / 64 for t in times],
            "same_as_first": texts == first,
            "chars": sum(map(len, texts)),
            "texts_sha": hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16],
        }
    )
)
