#!/usr/bin/env bash
# Idle time of the warm worker inside one SLURM job, with and without the bundle feeder.
# Needs the one-node test SLURM (bash .ci/slurm-up.sh, as root) and the venv with .[slurm].
# The embedded default (8 takes; piper, resample, duration, whisper, resemblyzer, dnsmos), one
# emotion x 6 prompts in one bundle = one SLURM job; the test profile of tests/workflow/test_slurm.py.
#   bash docs/bench/slurm_bundle_idle.sh [WORKDIR]     (output: WORKDIR/idle.txt)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/bestofn-slurm-idle}
py=$repo/.venv/bin/python
mkdir -p "$work"
exec > >(tee "$work/idle.txt") 2>&1
date -u; uptime
for mode in feeder nofeeder; do
  "$py" - "$work/$mode" <<PY
import shutil, sys
from pathlib import Path
import yaml
sys.path.insert(0, "$repo/tests")
import test_slurm
root = Path(sys.argv[1]); shutil.rmtree(root, ignore_errors=True)
test_slurm.make_project(root, ["calm"], prompts=6, components=6)
cfg = yaml.safe_load(open("$repo/config/config.yaml"))
(root / "config/config.yaml").write_text(yaml.safe_dump(cfg))
PY
  cd "$work/$mode"
  if [ "$mode" = nofeeder ]; then export BESTOFN_BUNDLE_FEEDER=0; else unset BESTOFN_BUNDLE_FEEDER; fi
  /usr/bin/time -f "$mode snakemake wall=%e" "$repo/.venv/bin/snakemake" \
    --snakefile "$repo/Snakefile" --profile profile >run.log 2>&1
  echo "$mode rc=$?"; uptime
  "$repo/.venv/bin/bestofn" verify results | tail -1
  "$py" -c "
import duckdb
c = duckdb.connect('results/bestofn.duckdb', read_only=True)
print(c.sql(\"select level, slurm_job_id, groups, loads, round(load_s,1) load_s, round(wall_s,1) wall_s, round(idle_s,3) idle_s, round(100*idle_fraction,2) idle_pct, round(elapsed_s,1) elapsed_s from throughput where level <> 'group'\"))
print(c.sql(\"select group_id, round(wall_s,2) wall_s, round(idle_s,3) idle_s from throughput where level = 'group' order by started_at\"))
"
done
date -u
