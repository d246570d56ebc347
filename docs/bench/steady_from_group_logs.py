"""The steady state of a gpu_workflow.sh run from its group logs (each group's end as the
client logged it): first end to last end over the clips after the first group, and the same
after two; plus the first and last groups' walls (a lone group's wall is ~4 s, a paired
group's 5-8 s). Matches summary.json's figures within 0.0003 s/clip where both exist, and
gives them for a run cut after snakemake ended, before its summary.

    python3 docs/bench/steady_from_group_logs.py [--takes 64] RUN_DIR ...
    (RUN_DIR holds logs/groups/e*/p*.log)
"""

import datetime
import glob
import json
import re
import sys

args = sys.argv[1:]
takes = 64
if args[:1] == ["--takes"]:
    takes, args = int(args[1]), args[2:]
for d in args:
    ends = []
    for f in glob.glob(f"{d}/logs/groups/e*/p*.log"):
        for line in open(f):
            m = re.match(r"(\S+ \S+) group (e\d+/p\d+) on slot \d+: (.*)", line)
            if m:
                t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
                ends.append((t, m.group(2), json.loads(m.group(3))["timings"]["wall_s"]))
    ends.sort()
    if len(ends) < 2:
        print(f"error: {d}: {len(ends)} group end(s) in logs/groups/e*/p*.log, need 2 or more",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    span = (ends[-1][0] - ends[0][0]).total_seconds()
    span2 = (ends[-1][0] - ends[1][0]).total_seconds()
    after_two = round(span2 / (takes * (len(ends) - 2)), 4) if len(ends) > 2 else None
    print(
        d, len(ends), "steady", round(span / (takes * (len(ends) - 1)), 4),
        "after two", after_two,
        "first/last wall", round(ends[0][2], 2), round(ends[-1][2], 2),
    )  # fmt: skip
