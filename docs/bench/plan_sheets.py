"""Make a planning benchmark directory: E emotions x P prompts with the tiny config.

python docs/bench/plan_sheets.py /tmp/plan/g16k 40 400
cd /tmp/plan/g16k
snakemake --snakefile REPO/Snakefile -n --quiet rules --profile REPO/profiles/local
"""

import shutil
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def main(root: Path, n_emotions: int, n_prompts: int) -> None:
    shutil.rmtree(root, ignore_errors=True)
    (root / "config/voices").mkdir(parents=True)
    shutil.copy(REPO / "config/voices/joe_reference.flac", root / "config/voices/ref.flac")
    emotions = ["emotion\tdescription\treference_audio"] + [
        f"e{i:03d}\tEmotion number {i}.\tconfig/voices/ref.flac" for i in range(n_emotions)
    ]
    prompts = ["prompt_id\ttext"] + [
        f"p{i:06d}\tThis is test prompt number {i} for the planner." for i in range(n_prompts)
    ]
    (root / "config/emotions.tsv").write_text("\n".join(emotions) + "\n")
    (root / "config/prompts.tsv").write_text("\n".join(prompts) + "\n")
    config = {
        "emotions": "config/emotions.tsv",
        "prompts": "config/prompts.tsv",
        "results": "results",
        "takes": 2,
        "seed": 7,
        "models": {
            "generator": {"backend": "piper"},
            "restorer": {"backend": "identity"},
            "scorers": [{"backend": "duration"}],
        },
        "selection": {"filter": "words_per_s > 0.5", "score": "-abs(words_per_s - 2.5)"},
    }
    (root / "config/config.yaml").write_text(yaml.safe_dump(config))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
