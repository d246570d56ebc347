"""The Parakeet decoding each take's row names (its `models` provenance), counted."""

import json
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

seen = Counter()
for f in Path(sys.argv[1]).glob("groups/*/*/scores.parquet"):
    for models in pq.read_table(f, columns=["models"]).column("models").to_pylist():
        for s in json.loads(models)["scorers"]:
            if "decoding" in s:
                seen[s["decoding"]] += 1
print("parakeet decoding per take:", dict(seen))
