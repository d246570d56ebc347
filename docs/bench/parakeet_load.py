"""Parakeet's build (``ParakeetScorer``, as a worker builds it) with and without the worker
cache's extracted archive, alternately, on the page-cached archive with its hash memoised; and
from the cache with the archive's own config (``_config_without_vocabulary`` switched off in
this process: the older build) against the one without its vocabulary lists.

    python docs/bench/parakeet_load.py NEMO CACHE_DIR [REPEATS]

NEMO: e.g. the real-size random archive ``bestofn fake-weights --size real`` writes
(``parakeet-tdt-0.6b-v3-CALIBRATED/parakeet-tdt-0.6b-v3.nemo``). Prints seconds per build."""

import gc
import json
import sys
import time
from pathlib import Path

from bestofn.backends import parakeet
from bestofn.backends.parakeet import ParakeetScorer
from bestofn.util import caches, hashing

nemo, cache = sys.argv[1], Path(sys.argv[2])
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
(cache / "sha256-memo").mkdir(parents=True, exist_ok=True)
hashing.set_memo_dir(cache / "sha256-memo")
caches.set_root(cache / "backends")
ParakeetScorer(model_path=nemo)  # page cache, hash memo and the extracted copy, untimed
strip = parakeet._config_without_vocabulary
variants = {  # label: (cache root, the config's vocabulary lists left to the tokenizer)
    "unpacked by NeMo": (None, False),
    "extracted, the archive's config": (cache / "backends", False),
    "extracted, no vocabulary lists": (cache / "backends", True),
}
seconds: dict[str, list[float]] = {label: [] for label in variants}
for _ in range(repeats):
    for label, (root, lists_left_out) in variants.items():
        caches.set_root(root)
        parakeet._config_without_vocabulary = strip if lists_left_out else (lambda members: None)
        gc.collect()
        t0 = time.perf_counter()
        ParakeetScorer(model_path=nemo)
        seconds[label].append(round(time.perf_counter() - t0, 2))
print(json.dumps(seconds))
