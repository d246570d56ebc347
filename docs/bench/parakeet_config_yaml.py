"""Parakeet's cached-config read, this tree's against an older tree's (OLD_SRC: its `src`), on a
real-size Parakeet fake's model_config.yaml, 5 rounds alternately; both must give one config.

    python docs/bench/parakeet_config_yaml.py OLD_SRC
"""

import importlib.util
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bestofn.backends import parakeet as new
from bestofn.fakes import parakeet as fake

spec = importlib.util.spec_from_file_location(
    "old_parakeet", Path(sys.argv[1]) / "bestofn/backends/parakeet.py"
)
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
with tempfile.TemporaryDirectory() as tmp:
    t = time.perf_counter()
    model = fake.build_tdt_model(Path(tmp), fake.REAL_SIZE, seed=0)
    model.save_to(f"{tmp}/pk.nemo")
    print(f"real-size fake written in {time.perf_counter() - t:.1f} s")
    with tarfile.open(f"{tmp}/pk.nemo") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("model_config.yaml"))
        member.name = "model_config.yaml"
        tar.extract(member, f"{tmp}/members", filter="data")
    members = Path(tmp) / "members"
    rows = {"old": [], "new": []}
    for _ in range(5):
        for tag, module in (("old", old), ("new", new)):
            t = time.perf_counter()
            config = module._config_without_vocabulary(members)
            rows[tag].append(time.perf_counter() - t)
    assert config is not None and list(config.labels) == []
    from omegaconf import OmegaConf

    a, b = old._config_without_vocabulary(members), new._config_without_vocabulary(members)
    print("same config:", OmegaConf.to_yaml(a) == OmegaConf.to_yaml(b))
    for tag, seconds in rows.items():
        print(f"{tag}: " + " ".join(f"{s:.3f}" for s in seconds) + f"  (min {min(seconds):.3f} s)")
