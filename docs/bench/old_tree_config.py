"""Point a config written by today's `bestofn fake-weights` at another tree's stand-in codec, so
an older tree can run the same workflow on the same weights (a side-by-side device call).

    PYTHONPATH=OLD/src python3 docs/bench/old_tree_config.py WEIGHTS OLD_WEIGHTS

Writes OLD_WEIGHTS/: links to every checkpoint of WEIGHTS but the v2 codec, the older tree's
random stand-in codec (written by that tree's own ``bestofn.fakes.moss_codec``), and a
config.yaml with the codec path changed and the options that tree does not know removed (each
one printed). Run it with the older tree first on PYTHONPATH.
"""

import sys
from pathlib import Path

import yaml

from bestofn.fakes import moss_codec  # the older tree's
from bestofn.plan import load_config

new, old = Path(sys.argv[1]), Path(sys.argv[2])
size = sys.argv[3] if len(sys.argv) > 3 else "real"
old.mkdir(parents=True, exist_ok=True)
for d in new.iterdir():
    if d.name not in ("MOSS-Audio-Tokenizer-v2", "config.yaml") and not (old / d.name).exists():
        (old / d.name).symlink_to(d)
codec = moss_codec.write(old / "MOSS-Audio-Tokenizer-v2-STAND-IN", size, seed=0)
config = yaml.safe_load((new / "config.yaml").read_text())
config["models"]["generator"]["options"]["codec_dir"] = str(codec)
# options today's schema has and the older one may not: drop them one at a time until it loads
text = yaml.safe_dump(config, sort_keys=False).replace(str(new) + "/", str(old) + "/")
config = yaml.safe_load(text)
for _ in range(20):
    (old / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        load_config(old / "config.yaml")
        break
    except Exception as e:  # the older schema names the field it refuses
        message = str(e)
        print("older schema:", message.splitlines()[0][:200])
        dropped = False
        for role in ["generator", "restorer"]:
            section = config["models"].get(role) or {}
            for part in ("runtime", "options"):
                for key in list(section.get(part) or {}):
                    if f"'{key}'" in message:
                        print(f"  dropped models.{role}.{part}.{key}")
                        del section[part][key]
                        dropped = True
        for scorer in config["models"].get("scorers", []):
            for part in ("runtime", "options"):
                for key in list(scorer.get(part) or {}):
                    if f"'{key}'" in message:
                        print(f"  dropped {scorer['backend']}.{part}.{key}")
                        del scorer[part][key]
                        dropped = True
        for key in list(config.get("runtime") or {}):
            if f"'{key}'" in message:
                print(f"  dropped runtime.{key}")
                del config["runtime"][key]
                dropped = True
        if not dropped:
            raise
print(f"config: {old / 'config.yaml'}")
