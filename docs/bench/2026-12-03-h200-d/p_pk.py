"""Parakeet's build alone, from the worker cache, under cProfile (the H200): where its
seconds go after the vocabulary-list change. (Reformatted for ruff after the call; the same
statements ran.)

    python p_pk.py WEIGHTS CACHE_DIR
"""

import cProfile
import importlib
import pstats
import sys
import time
from pathlib import Path

import yaml

from bestofn.backends import registry
from bestofn.worker import startup

weights, cache = Path(sys.argv[1]), sys.argv[2]
startup.use_cache_dir(cache)
c = yaml.safe_load((weights / "config.yaml").read_text())
entry = next(s for s in c["models"]["scorers"] if s["backend"] == "parakeet")
for module in ("torch", "nemo.collections.asr.models"):  # imports outside the profile
    importlib.import_module(module)
t = time.perf_counter()
pr = cProfile.Profile()
pr.enable()
registry.build("scorer", "parakeet", entry.get("options", {}), "cuda")
pr.disable()
print(f"parakeet build {time.perf_counter() - t:.1f} s (under cProfile)")
st = pstats.Stats(pr)
st.sort_stats("cumulative").print_stats(28)
st.sort_stats("tottime").print_stats(15)
