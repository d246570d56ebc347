"""Parakeet's build (``ParakeetScorer``, as a worker builds it) with and without the worker
cache's extracted archive, alternately, on the page-cached archive with its hash memoised.

    python docs/bench/parakeet_load.py NEMO CACHE_DIR [REPEATS]

NEMO: e.g. the real-size random archive ``bestofn fake-weights --size real`` writes
(``parakeet-tdt-0.6b-v3-CALIBRATED/parakeet-tdt-0.6b-v3.nemo``). Prints seconds per build."""

import json
import sys
import time
from pathlib import Path

from bestofn import caches, hashing
from bestofn.backends.parakeet import ParakeetScorer

nemo, cache = sys.argv[1], Path(sys.argv[2])
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
(cache / "sha256-memo").mkdir(parents=True, exist_ok=True)
hashing.set_memo_dir(cache / "sha256-memo")
caches.set_root(cache / "backends")
ParakeetScorer(model_path=nemo)  # page cache, hash memo and the extracted copy, untimed
seconds: dict[str, list[float]] = {"unpacked by NeMo": [], "extracted in the cache": []}
for _ in range(repeats):
    for label, root in (("unpacked by NeMo", None), ("extracted in the cache", cache / "backends")):
        caches.set_root(root)
        t0 = time.perf_counter()
        ParakeetScorer(model_path=nemo)
        seconds[label].append(round(time.perf_counter() - t0, 2))
print(json.dumps(seconds))
