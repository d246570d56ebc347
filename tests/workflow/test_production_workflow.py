"""The whole production workflow on a CPU, as a user runs it, on random weights:

    bestofn fake-weights TMP --size tiny
    snakemake --snakefile REPO/Snakefile --directory PROJECT --profile REPO/profiles/local \
              --configfile TMP/config.yaml
    bestofn verify results

moss-fast -> Sidon -> duration, Parakeet, VoiceCLAP, Empathic-Insight, every one of them loaded
by its real loader from the published on-disk layout, in one warm worker."""

import hashlib
import importlib.util
import shutil
from pathlib import Path

import duckdb
import pytest
import yaml
from helpers import REPO, snakemake, verify

from bestofn.cli import main as bestofn
from bestofn.select.held_out import referenced_columns

pytestmark = [  # snakemake end to end on the production backends
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(m) for m in ("transformers", "nemo")),
        reason="the production backends need transformers and nemo_toolkit[asr]",
    ),
]
GROUPS = ["angry/p1", "angry/p2", "calm/p1", "calm/p2"]


def expected_columns(weights: Path) -> set[str]:
    """Every production scorer's columns; Empathic-Insight's come from its head files."""
    from bestofn.backends.duration import DurationScorer
    from bestofn.backends.empathic import column_name, head_name
    from bestofn.backends.parakeet import ParakeetScorer
    from bestofn.backends.speaker import SpeakerScorer
    from bestofn.backends.voiceclap import VoiceCLAPScorer

    heads = sorted((weights / "Empathic-Insight-Voice-Plus").glob("*.pth"))
    assert len(heads) == 4
    ei = {column_name(head_name(p), "ei_") for p in heads}
    ei |= {"ei_target"}  # the group's own emotion's head
    return {
        *DurationScorer.columns,
        *ParakeetScorer.columns,
        *VoiceCLAPScorer.columns,
        *ei,
        *SpeakerScorer.columns,  # spk_sim, spk_ref
    }


def _tree_bytes(root):
    """Every file under ``root`` by relative path: its bytes (paths under ``root`` written as
    ROOT). A .nemo archive is not byte-stable even between two writes one after the other (NeMo
    names each artifact with a random uuid, its config names a temporary directory, and the
    SentencePiece tokenizer is trained anew), so of it: the member names without their uuid,
    and the weights' bytes."""
    import re
    import tarfile

    out = {}
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        rel = str(p.relative_to(root))
        if p.suffix == ".nemo":
            with tarfile.open(p) as tar:
                names = sorted(re.sub(r"[0-9a-f]{32}_", "", m.name) for m in tar if m.isfile())
                weights = tar.extractfile("./model_weights.ckpt").read()
            out[rel] = (names, weights)
        else:
            out[rel] = p.read_bytes().replace(str(root).encode(), b"ROOT")
    return out


def test_fake_weights_through_snakemake_verify_and_duckdb(tiny_fake_weights, tmp_path, capsys):
    # the session's tree (conftest.py: `bestofn fake-weights --size tiny` through the command's
    # own entry point, in a process of the run), read only here: the run writes under project
    weights, project = tiny_fake_weights, tmp_path / "project"
    # the same written three backends at a time, each in its own process: the same bytes
    assert bestofn(["fake-weights", str(tmp_path / "jobs"), "--jobs", "3"]) == 0
    serial, jobs = _tree_bytes(weights), _tree_bytes(tmp_path / "jobs")
    assert sorted(serial) == sorted(jobs)
    assert [f for f in serial if serial[f] != jobs[f]] == []
    assert bestofn(["fake-weights", str(tmp_path / "bad"), "--jobs", "0"]) == 2
    config = weights / "config.yaml"
    assert bestofn(["check", "--config", str(config)]) == 0
    assert "ok: 4 groups x 4 takes" in capsys.readouterr().out

    # A user's checkout has the embedded default in config/config.yaml; the profile makes
    # --configfile replace it (merged, piper's options would land in moss-fast's).
    shutil.copytree(REPO / "config", project / "config")
    snakemake(project, "--configfile", str(config))
    assert "4 groups checked, 0 problem(s)" in verify(project)
    # the worker kept Parakeet's archive extracted in its cache, named by the archive's sha256
    written = yaml.safe_load(config.read_text())
    scorers = written["models"]["scorers"]
    nemo = next(s["options"]["model_path"] for s in scorers if s["backend"] == "parakeet")
    nemo = Path(written["weights_root"]) / nemo  # the model paths are relative to it
    digest = hashlib.sha256(Path(nemo).read_bytes()).hexdigest()
    extracted = project / "results/cache/backends/nemo-extracted"
    assert [p.name for p in extracted.iterdir() if p.is_dir()] == [digest]  # no leftovers
    assert (extracted / digest / "model_config.yaml").is_file()

    con = duckdb.connect(str(project / "results/bestofn.duckdb"), read_only=True)
    columns = {row[0] for row in con.execute("DESCRIBE takes").fetchall()}
    missing = (expected_columns(weights) | {"n_frames", "truncated", "stop_reason"}) - columns
    assert not missing, f"takes lacks {sorted(missing)}"

    takes = con.execute(
        "SELECT group_id, count(*), count(DISTINCT worker_pid), min(sample_rate), max(sample_rate),"
        " count(wer), count(vc_genuineness), count(ei_anger) FROM takes GROUP BY 1 ORDER BY 1"
    ).fetchall()
    # 4 takes per group, one warm worker, Sidon's 48 kHz, every scorer filled every row
    assert takes == [(g, 4, 1, 48000, 48000, 4, 4, 4) for g in GROUPS]
    # spk_sim against the sheet's reference voice where the emotion has one, else the centroid
    refs = con.execute(
        "SELECT DISTINCT split_part(group_id, '/', 1), spk_ref FROM takes "
        "WHERE spk_sim BETWEEN -1.0001 AND 1.0001 ORDER BY 1"
    ).fetchall()
    assert refs == [("angry", "group_centroid"), ("calm", "reference")]
    generators = con.execute("SELECT DISTINCT generator FROM takes").fetchall()
    assert generators == [("moss-fast",)]
    # the tuned stop head: takes end on their stop token and on the budget, never all at once
    reasons = {r for (r,) in con.execute("SELECT DISTINCT stop_reason FROM takes").fetchall()}
    assert {"eos", "budget"} <= reasons <= {"eos", "budget", "empty"}

    selection = con.execute(
        "SELECT s.group_id, count(*), min(t.n_frames) FROM selection s "
        "JOIN takes t USING (group_id, take) GROUP BY 1 ORDER BY 1"
    ).fetchall()
    # the named reward on per-emotion scales and ei_spec: its top 2 per group, dedup beside
    # the default's pick
    picks = con.execute(
        "SELECT reward, group_id, list(rank ORDER BY rank) FROM reward_picks GROUP BY ALL"
    ).fetchall()
    kept = con.execute("SELECT count(*), sum(len(rewards)) FROM reward_selection").fetchone()
    n_pass = dict(con.execute("SELECT group_id, n_pass FROM groups").fetchall())
    con.close()
    emo = [("emo", g, list(range(1, min(2, n_pass[g]) + 1))) for g in GROUPS]
    assert sorted(picks) == sorted([("default", g, [1]) for g in GROUPS] + emo)
    assert kept[1] == len(GROUPS) + sum(len(r) for _, _, r in emo)  # every win is listed
    assert kept[0] <= kept[1]  # a take that won both is one row
    assert [(g, n) for g, n, _ in selection] == [(g, 1) for g in GROUPS]  # one take per group
    assert all(n_frames > 0 for _, _, n_frames in selection)  # the config's filter held
    # the selection is the recipes': the group's own emotion, VoiceCLAP's heads (no speaker
    # floor: "angry" has no reference voice)
    sel = yaml.safe_load(config.read_text())["selection"]
    used = referenced_columns(sel["filter"]) | referenced_columns(sel["score"])
    assert {"ei_target", "vc_blend", "vc_genuineness"} <= used and "spk_sim" not in used
    con = duckdb.connect(str(project / "results/bestofn.duckdb"), read_only=True)
    # ei_target is each group's own head (the sheet's ei_head), never NaN
    own = con.execute(
        "SELECT DISTINCT split_part(group_id, '/', 1), ei_target = CASE WHEN emotion = 'angry' "
        "THEN ei_anger ELSE ei_jealousy_envy END FROM takes ORDER BY 1"
    ).fetchall()
    con.close()
    assert own == [("angry", True), ("calm", True)]
