"""``pair_groups: true`` end to end through snakemake on a CPU (tiny random moss-fast, one warm
worker): four groups of one prompt bucket run with room for partners (queue depth 4, four jobs
in flight), then again one at a time (queue depth 1: every group alone, and the workflow warns
that pairing finds no partners so). Every group's FLACs are the same bytes both times, and the
rows name the partners the first run found."""

import hashlib
import importlib.util

import duckdb
import pytest
import yaml
from helpers import snakemake, tiny_config, write_tsv

pytestmark = [  # snakemake end to end with MOSS
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None, reason="the MOSS codec needs transformers"
    ),
]


def _project(root, weights: dict, jobs: int, depth: int):
    write_tsv(root / "config/emotions.tsv", ["emotion", "description"],
              [["calm", "A calm voice."], ["happy", "A happy voice."]])  # fmt: skip
    write_tsv(root / "config/prompts.tsv", ["prompt_id", "text"],
              [["p1", "Good morning to you."], ["p2", "It is nine o'clock."]])  # fmt: skip
    generator = {
        "backend": "moss-fast",
        "options": {**weights, "min_frames": 4, "max_frames": 12, "hash_weights": False},
        "runtime": {"pair_groups": True, "batch_size": 4},
    }
    config = tiny_config(takes=3, runtime={"queue_depth": depth})
    config["models"]["generator"] = generator
    config["selection"] = {"filter": "n_frames >= 0", "score": "-n_frames"}
    (root / "config/config.yaml").write_text(yaml.safe_dump(config))
    return root, ("--resources", f"group_slots={jobs}", "--cores", str(max(jobs, 2)))


def _flacs(project) -> dict[str, str]:
    groups = project / "results/groups"
    return {str(p.relative_to(groups)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(groups.glob("*/*/takes/*.flac"))}  # fmt: skip


def test_paired_groups_publish_the_takes_they_get_alone(tmp_path):
    from bestofn.fakes import moss

    weights = moss.write(tmp_path / "weights", "tiny", seed=2)
    together, args = _project(tmp_path / "together", weights, jobs=4, depth=4)
    ran_together = snakemake(together, *args)
    alone, args1 = _project(tmp_path / "alone", weights, jobs=1, depth=1)
    ran_alone = snakemake(alone, *args1)
    warning = "config runtime.queue_depth is 1: models.generator pair_groups finds partners"
    assert warning in ran_alone.stderr and "queue_depth is" not in ran_together.stderr

    assert len(_flacs(together)) == 12 and _flacs(together) == _flacs(alone)
    con = duckdb.connect(str(together / "results/bestofn.duckdb"), read_only=True)
    partners = dict(
        con.execute("SELECT group_id, any_value(paired_with) FROM takes GROUP BY 1").fetchall()
    )
    con.close()
    # four jobs at one worker of depth 4, sent as it became ready: every group finds a partner
    # (a first group that arrives before its partner waits for it: runner.PAIR_IDLE_WAIT_S)
    paired = {g: p for g, p in partners.items() if p}
    assert len(paired) == 4, f"not every group was paired: {partners}"
    assert all(paired.get(p) == g for g, p in paired.items())  # partners name each other
    con = duckdb.connect(str(alone / "results/bestofn.duckdb"), read_only=True)
    assert con.execute("SELECT DISTINCT paired_with FROM takes").fetchall() == [("",)]
    con.close()
