import shutil
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    return path


def tiny_config(**overrides) -> dict:
    """A fast config: piper generator, no restoration, duration + whisper scorers."""
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
    config.update(overrides)
    return config


@pytest.fixture
def project(tmp_path):
    """A working directory with config/ (tiny config, 2 emotions x 2 prompts) and a voice."""
    (tmp_path / "config" / "voices").mkdir(parents=True)
    shutil.copy(REPO / "config/voices/joe_reference.flac", tmp_path / "config/voices/ref.flac")
    write_tsv(
        tmp_path / "config/emotions.tsv",
        ["emotion", "description", "reference_audio"],
        [["calm", "A calm voice.", "config/voices/ref.flac"], ["happy", "A happy voice.", ""]],
    )
    write_tsv(
        tmp_path / "config/prompts.tsv",
        ["prompt_id", "text"],
        [["p1", "Good morning to you."], ["p2", "It is nine o'clock."]],
    )
    (tmp_path / "config/config.yaml").write_text(yaml.safe_dump(tiny_config()))
    return tmp_path


# The longest files first: with `pytest -n 2 --dist loadfile` (make test) a file runs whole on one
# worker, in collection order, so a long file collected last would run alone at the end.
_LONGEST_FIRST = ("test_slurm.py", "test_snakemake_speedups.py", "test_moss_delay.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file keeps its own order
