"""Issue 15 on a CPU: the worker's overlap of consecutive groups (runtime.overlap) gives the
same groups as the sequential path; a fatal device error still ends the worker with exit 70
and names the group; per-stage GPU columns reach the throughput table; Parakeet's deferred
text work and Sidon's device resampling give the results of the old paths."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bestofn.core.pipeline import Backends
from bestofn.core.runner import resolve_overlap, run_group
from bestofn.util.spec import GroupSpec

pytestmark = [
    pytest.mark.slow,  # groups through the worker's runner, stages overlapped
    # whether NeMo is installed, not imported (~8 s, paid by every pytest-xdist worker while
    # collecting): the tests import it where they run
    pytest.mark.skipif(
        importlib.util.find_spec("nemo") is None, reason="nemo_toolkit[asr] not installed"
    ),
]

MODELS = {"generator": {"backend": "piper"}, "scorers": [{"backend": "duration"}]}
TEXTS = ["Good morning to you.", "It is nine o'clock.", "The train leaves at nine."]
# what differs between two runs of the same group by design (timings, pids, the mode)
RUN_COLUMNS = {
    "group_generate_s", "group_restore_s", "group_score_s", "group_write_s", "group_wall_s",
    "group_load_s", "worker_idle_s", "score_seconds", "worker_pid", "worker_slot", "started_at",
    "finished_at", "overlap", "group_generate_gpu_s", "group_restore_gpu_s", "group_score_gpu_s",
    "score_gpu_seconds", "flac_path",
}  # fmt: skip


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    """piper (the embedded generator) -> tiny Sidon -> duration + tiny Parakeet: a group with
    a restorer and a scorer that defers its text work, built once."""
    from bestofn.backends import registry
    from bestofn.fakes import parakeet, sidon

    gen = registry.build("generator", "piper", {}, "cpu")
    restorer = sidon.build("cpu", "tiny", batch_size=2)
    asr = parakeet.build("cpu", "tiny", str(tmp_path_factory.mktemp("asr")), batch_size=2)
    scorers = [registry.build("scorer", "duration", {}, "cpu"), asr]
    models = {"generator": {"backend": "piper"}, "restorer": {"backend": "sidon"},
              "scorers": [{"backend": "duration"}, {"backend": "parakeet"}]}  # fmt: skip
    prov = {"generator": gen.provenance(), "restorer": restorer.provenance(),
            "scorers": [s.provenance() for s in scorers]}  # fmt: skip
    return Backends(gen, restorer, scorers, models, 0.0, prov)


def _worker(tmp_path: Path, backends: Backends, overlap: str):
    from bestofn.worker.options import WorkerOptions
    from bestofn.worker.server import Worker

    w = Worker(
        MODELS, tmp_path / "results", "cpu", WorkerOptions(idle_timeout_s=60.0, overlap=overlap)
    )
    w.backends = backends  # the shared tiny production backends
    return w


def _spec(i: int) -> GroupSpec:
    return GroupSpec("calm", f"p{i}", TEXTS[i], 3, base_seed=7)


def _run_concurrently(w, tmp_path: Path, n: int) -> list:
    """n groups posted at once, as queue_depth clients would; returns answers or errors."""
    results: list = [None] * n

    def one(i):
        out = str(tmp_path / "results/groups/calm" / f"p{i}")
        body = {"worker_key": w.worker_key, "spec": asdict(_spec(i)), "out": out,
                "workdir": str(tmp_path)}  # fmt: skip
        try:
            results[i] = w.run_group(body)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
        time.sleep(0.05)  # arrival order p0, p1, p2
    for t in threads:
        t.join(300)
    return results


def _group_digest(group_dir: Path) -> dict:
    table = pq.read_table(group_dir / "scores.parquet")
    rows = {c: table.column(c).to_pylist() for c in table.column_names if c not in RUN_COLUMNS}
    flacs = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((group_dir / "takes").glob("*.flac"))
    }
    return {"rows": rows, "flacs": flacs}


def test_overlap_modes_publish_the_same_groups(backends, tmp_path):
    digests, modes_seen = {}, {}
    for mode in ("off", "host", "full"):
        w = _worker(tmp_path / mode, backends, mode)
        assert w.overlap == mode and w.health()["overlap"] == mode
        answers = _run_concurrently(w, tmp_path / mode, len(TEXTS))
        assert all(isinstance(a, dict) for a in answers), answers
        assert w.groups_served == len(TEXTS) and w.in_flight == 0
        digests[mode] = [
            _group_digest(tmp_path / mode / "results/groups/calm" / f"p{i}")
            for i in range(len(TEXTS))
        ]
        table = pq.read_table(tmp_path / mode / "results/groups/calm/p0/scores.parquet")
        modes_seen[mode] = set(table.column("overlap").to_pylist())
        # off CUDA there are no CUDA events: the GPU columns are NULL
        assert set(table.column("group_generate_gpu_s").to_pylist()) == {None}
        assert answers[0]["timings"]["score_s"] > 0
        # the model load is charged to exactly one group of the worker
        loads = [
            pq.read_table(tmp_path / mode / f"results/groups/calm/p{i}/scores.parquet")
            .column("group_load_s")[0]
            .as_py()
            for i in range(len(TEXTS))
        ]
        assert sum(1 for x in loads if x > 0) <= 1
    assert modes_seen == {"off": {"off"}, "host": {"host"}, "full": {"full"}}
    assert digests["host"] == digests["off"]
    assert digests["full"] == digests["off"]
    # and the same as the plain function the group job calls
    run_group(_spec(1), backends, tmp_path / "plain/calm/p1")
    assert _group_digest(tmp_path / "plain/calm/p1") == digests["off"][1]
    transcripts = digests["off"][0]["rows"]["transcript"]
    assert len(transcripts) == 3 and all(isinstance(t, str) for t in transcripts)


def test_a_group_is_the_same_whatever_torch_threads_the_calling_thread_has(backends, tmp_path):
    """The test above once failed in CI at its plain run_group, as it does when the test's
    thread runs torch on another intra-op thread count than the worker's new request threads
    (torch keeps the count per thread; a thread whose first torch call falls inside another
    thread's temporary change keeps the changed count): Sidon's decoder convolutions give other
    bits with another count. The stages run on ``backends.cpu_threads`` in any thread."""
    import torch

    run_group(_spec(2), backends, tmp_path / "a/calm/p2")
    before = torch.get_num_threads()
    other = 1 if backends.cpu_threads != 1 else 2
    torch.set_num_threads(other)
    try:
        run_group(_spec(2), backends, tmp_path / "b/calm/p2")
        assert torch.get_num_threads() == other  # the stages gave this thread its count back
    finally:
        torch.set_num_threads(before)
    assert _group_digest(tmp_path / "b/calm/p2") == _group_digest(tmp_path / "a/calm/p2")


def test_a_failing_stage_names_the_group_and_the_worker_keeps_serving(backends, tmp_path):
    from bestofn.worker.requests import BadRequest
    from lab.faults import FatalOnceScorer

    flaky = FatalOnceScorer(marker=str(tmp_path / "m"), group="calm/p1", error="oom")
    b = Backends(backends.generator, backends.restorer, [*backends.scorers, flaky],
                 backends.models, 0.0, backends.provenance)  # fmt: skip
    w = _worker(tmp_path, b, "host")
    died = []
    w.die = died.append  # (the real one exits the process)
    answers = _run_concurrently(w, tmp_path, 3)
    err = answers[1]
    assert isinstance(err, Exception) and "group calm/p1" in str(err)
    assert "CUDA out of memory" in str(err) and not died
    assert isinstance(answers[0], dict) and isinstance(answers[2], dict)
    assert not (tmp_path / "results/groups/calm/p1").exists()
    # a fatal one marks the worker dying; the groups queued behind it are refused (503)
    (tmp_path / "m").unlink()
    fatal = FatalOnceScorer(marker=str(tmp_path / "m"), group="calm/p1")
    b.scorers[-1] = fatal
    w = _worker(tmp_path / "again", b, "host")

    def die(reason):
        died.append(reason)
        w.fatal = reason

    w.die = die
    answers = _run_concurrently(w, tmp_path / "again", 3)
    assert died and "group calm/p1" in died[0] and "illegal memory access" in died[0]
    assert isinstance(answers[2], BadRequest) and answers[2].status == 503


def test_fatal_device_error_with_overlap_exits_70(tmp_path):
    """The real worker process, overlap 'full': 500 naming the group, then exit status 70."""
    from bestofn.worker.lifecycle import EXIT_FATAL
    from bestofn.worker.uds_http import request

    models = {
        "generator": {"backend": "lab.faults:ScriptedGenerator",
                      "options": {"seconds": 0.3}},
        "scorers": [{"backend": "duration"}, {"backend": "lab.faults:FatalOnceScorer",
                     "options": {"marker": str(tmp_path / "m"), "group": "calm/p0"}}],
    }  # fmt: skip
    (tmp_path / "models.json").write_text(json.dumps(models))
    sock = str(tmp_path / "w.sock")
    results = tmp_path / "results"
    results.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bestofn.cli", "worker", "--socket", sock, "--models-file",
         str(tmp_path / "models.json"), "--results", str(results),
         "--options", json.dumps({"overlap": "full", "idle_timeout_s": 60})],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ},
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not Path(sock).exists():
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()
            time.sleep(0.1)
        status, health, _ = request(sock, "GET", "/health", None, timeout=30)
        assert status == 200 and health["overlap"] == "full"
        body = {"spec": asdict(_spec(0)), "out": str(results / "calm/p0"),
                "worker_key": health["worker_key"]}  # fmt: skip
        status, answer, _ = request(sock, "POST", "/v1/groups", body, timeout=120)
        assert status == 500 and answer["worker_exiting"] is True
        assert "group calm/p0" in answer["fatal"] and "illegal memory access" in answer["fatal"]
        assert proc.wait(timeout=60) == EXIT_FATAL
        assert not (results / "calm/p0").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_overlap_modes_resolve():
    assert resolve_overlap("auto", "cpu") == "off"
    assert resolve_overlap("auto", "cuda:0") == "full"
    assert resolve_overlap(None, "cuda") == "full"
    assert resolve_overlap("full", "cpu") == "full"
    with pytest.raises(ValueError, match="runtime.overlap"):
        resolve_overlap("sometimes", "cpu")


def test_throughput_table_has_gpu_columns(backends, tmp_path):
    """GPU seconds per stage reach the throughput table; NULL off CUDA, summed per worker."""
    import duckdb
    import pyarrow as pa

    from bestofn.select.database import build_database

    timings = run_group(_spec(0), backends, tmp_path / "g/calm/p0")
    # plain numbers (the group job logs them rounded); no GPU keys off CUDA
    assert all(isinstance(v, float) for v in timings.values()) and "score_gpu_s" not in timings
    path = tmp_path / "g/calm/p0/scores.parquet"
    # a second group as a CUDA worker would have written it
    t = pq.read_table(path)
    for col, v in (("group_generate_gpu_s", 2.0), ("group_restore_gpu_s", 1.0),
                   ("group_score_gpu_s", 0.5)):  # fmt: skip
        t = t.set_column(t.column_names.index(col), col, pa.array([v] * t.num_rows, pa.float64()))
    t = t.set_column(
        t.column_names.index("group_id"), "group_id", pa.array(["calm/p9"] * t.num_rows)
    )
    pq.write_table(t, tmp_path / "cuda.parquet")
    db = tmp_path / "db.duckdb"
    build_database([str(path), str(tmp_path / "cuda.parquet")], db, "true", "0")
    con = duckdb.connect(str(db), read_only=True)
    rows = dict(
        con.execute("SELECT group_id, gpu_busy_s FROM throughput WHERE level = 'group'").fetchall()
    )
    assert rows == {"calm/p0": None, "calm/p9": 3.5}
    per_clip, overlap = con.execute(
        "SELECT gpu_busy_s_per_clip, overlap FROM throughput WHERE group_id = 'calm/p9'"
    ).fetchone()
    assert per_clip == pytest.approx(3.5 / 3) and overlap == "off"
    from bestofn.report.throughput import gpu_busy_rows, gpu_busy_table

    (worker,) = gpu_busy_rows(con)  # one worker (this process) wrote both groups
    assert worker[4:7] == (2.0, 1.0, 0.5)
    table = "\n".join(gpu_busy_table([worker]))
    assert "## GPU time by stage" in table and f"| {worker[0]} | off | 6 |" in table
    # no GPU column was mistaken for a score (the trust tables skip base columns)
    cols = {r[0] for r in con.execute("SELECT DISTINCT column_name FROM score_gains").fetchall()}
    assert not any("gpu" in c for c in cols)


# ---- Parakeet and Sidon speed options keep the results ------------------------------------


def test_parakeet_deferred_text_work_gives_the_same_columns(backends):
    asr = backends.scorers[1]
    rng = np.random.default_rng(3)
    takes = [(0.1 * rng.standard_normal(int(s * 16000))).astype(np.float32)
             for s in (0.7, 1.9, 1.2, 2.6, 0.4)]  # fmt: skip
    spec = GroupSpec("calm", "p", "the quick brown fox", 5)
    finish = asr.score_deferred(takes, 16000, spec)
    assert finish() == asr.score(takes, 16000, spec)
    from bestofn.util.textnorm import asr_columns

    assert asr.score(takes, 16000, spec) == asr_columns(spec.text, asr.transcribe(takes, 16000))
    assert asr.compile is False  # compile is for CUDA only
    from bestofn.backends.parakeet import ParakeetScorer

    big = ParakeetScorer.from_modules(asr.model, "cpu", batch_size=128)
    assert big.transcribe(takes, 16000) == asr.transcribe(takes, 16000)


def test_device_resample_is_close_to_soxr():
    import torch

    from bestofn.backends.resample import resample_torch
    from bestofn.util.audio import resample

    t = np.arange(48000) / 48000
    x = np.stack([0.5 * np.sin(2 * np.pi * f * t) for f in (200, 1000, 5000)]).astype(np.float32)
    y = resample_torch(torch.from_numpy(x), 48000, 16000).numpy()
    for i in range(3):
        ref = resample(x[i], 48000, 16000)
        assert y.shape[1] == len(ref)
        np.testing.assert_allclose(y[i, 300:-300], ref[300:-300], atol=1e-5)
    # a tone above the new Nyquist frequency is filtered out, not folded back
    alias = resample_torch(torch.from_numpy(x[:1] * 0 + np.sin(2 * np.pi * 10000 * t)), 48000,
                           16000)  # fmt: skip
    assert float(alias[0, 300:-300].abs().max()) < 1e-4


def test_sidon_device_resample_and_buckets_keep_the_takes():
    from bestofn.fakes import sidon

    # band-limited takes (below 0.8 x the 8 kHz Nyquist frequency of 16 kHz), where both
    # resamplers agree; white noise differs in the transition band, by design of each filter
    takes = []
    for k, s in enumerate((0.6, 1.3, 0.9)):
        t = np.arange(int(s * 48000)) / 48000
        left = sum(np.sin(2 * np.pi * (180 + 90 * k) * h * t + h) / h for h in range(1, 20))
        takes.append((0.1 * np.stack([left, 0.8 * left], axis=1)).astype(np.float32))
    soxr = sidon.build("cpu", "tiny", batch_size=2)
    assert soxr.resample == "soxr"  # the CPU default: the old path
    ref, sr = soxr.restore(takes, 48000)
    dev = sidon.build("cpu", "tiny", batch_size=2, resample="torch")
    out, sr2 = dev.restore(takes, 48000)
    bucketed = sidon.build("cpu", "tiny", batch_size=2, bucket_s=1.0).restore(takes, 48000)[0]
    assert sr == sr2 == 48000
    # the device path's 16 kHz input is soxr's away from the edges (each filter starts and
    # ends a take its own way)
    from bestofn.util.audio import mono_at

    wav, n16 = dev._to_16k_on_device(takes, 48000)
    for k, host in enumerate(mono_at(takes, 48000, 16000)):
        assert n16[k] == len(host)
        np.testing.assert_allclose(wav[k, 100 : n16[k] - 100].numpy(), host[100:-100], atol=1e-4)
        assert not wav[k, n16[k] :].any()  # zero past the take
    for a, b, c, take in zip(ref, out, bucketed, takes, strict=True):
        assert len(a) == len(b) == len(c) == take.shape[0]
        # the restored takes: the same up to the edge differences, which the random tiny
        # network (per-take feature normalisation, no training) spreads a little
        assert np.corrcoef(a, b)[0, 1] > 0.99
        np.testing.assert_allclose(c, a, atol=1e-4)  # padding to buckets changes nothing
    with pytest.raises(ValueError, match="resample"):
        sidon.build("cpu", "tiny", resample="sinc")
    dev.set_speed(batch_size=1, resample="soxr", dtype="float32")  # back to the old path
    for a, b in zip(ref, dev.restore(takes, 48000)[0], strict=True):
        np.testing.assert_allclose(b, a, atol=1e-4)
    with pytest.raises(ValueError, match="dtype"):
        dev.set_speed(dtype="int8")


def test_bench_variants_parse():
    from lab.bench.pipeline import VARIANTS, parse_variant

    name, knobs = parse_variant("before")
    assert name == "before" and knobs["overlap"] == "off" and knobs["parakeet_batch"] == 64
    assert parse_variant("after")[1]["overlap"] == "host" and set(VARIANTS) >= {"before", "after"}
    name, knobs = parse_variant("x:overlap=full,parakeet_compile=on,sidon_bucket_s=1")
    assert knobs == {"overlap": "full", "parakeet_compile": True, "sidon_bucket_s": 1.0}
    with pytest.raises(SystemExit, match="unknown knob"):
        parse_variant("x:parakeet_beam=4")
    with pytest.raises(SystemExit, match="one of"):
        parse_variant("nameless")


def test_full_overlap_scores_a_group_while_the_next_is_restored(monkeypatch, tmp_path):
    """Under 'full' restore and score are phases of their own: group 0's score runs while
    group 1 is restored, and every phase keeps the groups' arrival order."""
    from types import SimpleNamespace

    from bestofn.core import runner as runner_mod

    spans: dict[tuple[str, str], tuple[float, float]] = {}

    def stage(name, seconds):
        def run(job_or_spec, *args, **kwargs):
            group = getattr(job_or_spec, "spec", job_or_spec).prompt_id
            t0 = time.monotonic()
            time.sleep(seconds)
            spans[(name, group)] = (t0, time.monotonic())
            return job_or_spec if name != "write" else {}

        return run

    def generate(spec, backends, device):
        stage("generate", 0.05)(spec)
        return SimpleNamespace(spec=spec)

    monkeypatch.setattr(runner_mod, "generate_stage", generate)
    monkeypatch.setattr(runner_mod, "restore_stage", stage("restore", 0.3))
    monkeypatch.setattr(runner_mod, "score_stage", stage("score", 0.3))
    monkeypatch.setattr(runner_mod, "write_stage", stage("write", 0.01))
    part = SimpleNamespace(close=lambda: None)
    backends = SimpleNamespace(generator=part, restorer=part, scorers=[part], load_s=0.0)
    r = runner_mod.Runner(backends, "cpu", "full")
    jobs = [runner_mod.GroupJob(GroupSpec("calm", f"p{i}", "Hi.", 2), tmp_path / f"p{i}")
            for i in range(3)]  # fmt: skip
    threads = []
    for job in jobs:  # arrival order: each thread starts after the one before is queued
        threads.append(threading.Thread(target=r.run, args=(job,)))
        threads[-1].start()
        time.sleep(0.02)
    for t in threads:
        t.join(30)
    assert r.describe()["overlap"] == "full"
    score0, restore1 = spans[("score", "p0")], spans[("restore", "p1")]
    assert restore1[0] < score0[1] and score0[0] < restore1[1], "p0 scored apart from p1 restored"
    for name in ("generate", "restore", "score", "write"):
        starts = [spans[(name, f"p{i}")][0] for i in range(3)]
        assert starts == sorted(starts), name
