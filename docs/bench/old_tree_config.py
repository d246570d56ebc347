"""Point a config written by today's `bestofn fake-weights` at another tree's stand-in codec, so
an older tree can run the same workflow on the same weights (a side-by-side device call).

    PYTHONPATH=OLD/src python3 docs/bench/old_tree_config.py WEIGHTS OLD_WEIGHTS

Writes OLD_WEIGHTS/: links to every checkpoint of WEIGHTS but the v2 codec, the older tree's
random stand-in codec (written by that tree's own ``bestofn.fakes.moss_codec``), and a
config.yaml with the codec path changed, checked by that tree's schema (the older tree first on
PYTHONPATH), for a side-by-side workflow of two trees (workflow_trees.sh).
"""

import sys
from pathlib import Path

import yaml

from bestofn.core.plan import load_config
from bestofn.fakes import moss_codec  # the older tree's

new, old = Path(sys.argv[1]), Path(sys.argv[2])
size = sys.argv[3] if len(sys.argv) > 3 else "real"
old.mkdir(parents=True, exist_ok=True)
for d in new.iterdir():
    if d.name not in ("MOSS-Audio-Tokenizer-v2", "config.yaml") and not (old / d.name).exists():
        (old / d.name).symlink_to(d)
codec = moss_codec.write(old / "MOSS-Audio-Tokenizer-v2-STAND-IN", size, seed=0)
config = yaml.safe_load((new / "config.yaml").read_text())
config["models"]["generator"]["options"]["codec_dir"] = str(codec)
text = yaml.safe_dump(config, sort_keys=False).replace(str(new) + "/", str(old) + "/")
(old / "config.yaml").write_text(text)
load_config(old / "config.yaml")  # the older schema: an option it does not know fails here, named
print(f"config: {old / 'config.yaml'}")
