"""Old ab's side A, in the main process: 'preimport' imports the scorers' classes in the main
thread first (old run_ab's _known_columns), 'plain' does not."""

import sys
from pathlib import Path

from bestofn import ab

mode, cfg, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
plan = ab._plan(cfg, Path("."), None)
models = plan.config["models"]
if mode == "preimport":
    print("known columns:", ab._known_columns(models), flush=True)
specs = list(plan.groups.values())[:3]
work.mkdir(parents=True, exist_ok=True)
out = ab.run_side("A", models, specs, plan.config["device"], work, print, None, 1)
print(f"{mode}: side A passed, {out['clips']} clips", flush=True)
