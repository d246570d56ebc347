"""Side A in the main process, with the plan made elsewhere: 'plan' writes the plan's models and
specs to a pickle (run it in another process); 'run' reads them and runs side A here."""

import pickle
import sys
from pathlib import Path

mode = sys.argv[1]
if mode == "plan":
    from bestofn import ab

    plan = ab._plan(Path(sys.argv[2]), Path("."), None)
    Path(sys.argv[3]).write_bytes(
        pickle.dumps((plan.config["models"], list(plan.groups.values())[:3], plan.config["device"]))
    )
else:
    models, specs, device = pickle.loads(Path(sys.argv[2]).read_bytes())
    from bestofn import ab

    work = Path(sys.argv[3])
    work.mkdir(parents=True, exist_ok=True)
    out = ab.run_side("A", models, specs, device, work, print, None, 1)
    print(f"split: side A passed, {out['clips']} clips", flush=True)
