"""One group = one directory, complete or absent; verify catches any mismatch."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from bestofn.core.groupio import SCORES, partial_dirs, write_group
from bestofn.ops.verify import verify_results

SR = 16000


def rows_for(group_dir, n, seconds=0.5):
    return pa.table(
        {
            "take": pa.array(range(n), pa.int32()),
            "flac_path": [str(group_dir / "takes" / f"{i:03d}.flac") for i in range(n)],
            "duration_s": [seconds] * n,
            "sample_rate": pa.array([SR] * n, pa.int32()),
        }
    )


def audios(n, seconds=0.5):
    rng = np.random.default_rng(0)
    return [rng.uniform(-0.5, 0.5, int(SR * seconds)).astype(np.float32) for _ in range(n)]


def test_write_group_publishes_complete_directory(tmp_path):
    group = tmp_path / "groups" / "calm" / "p1"
    write_group(group, audios(3), SR, rows_for(group, 3))
    assert sorted(p.name for p in (group / "takes").iterdir()) == [
        "000.flac",
        "001.flac",
        "002.flac",
    ]
    assert pq.read_table(group / SCORES).num_rows == 3
    audio, sr = sf.read(group / "takes" / "001.flac")
    assert sr == SR and audio.shape == (SR // 2,)
    assert partial_dirs(tmp_path / "groups") == []
    assert verify_results(tmp_path) == ([], [], 1)


def test_crash_mid_write_leaves_no_group(tmp_path):
    group = tmp_path / "groups" / "calm" / "p1"

    def crash(rows):
        raise RuntimeError("killed while writing")

    with pytest.raises(RuntimeError, match="killed"):
        write_group(group, audios(3), SR, rows_for(group, 3), finalize=crash)
    assert not group.exists()
    assert list((tmp_path / "groups" / "calm").iterdir()) == []


def test_rewrite_replaces_old_group_whole(tmp_path):
    group = tmp_path / "groups" / "calm" / "p1"
    write_group(group, audios(4), SR, rows_for(group, 4))
    write_group(group, audios(2), SR, rows_for(group, 2))
    assert sorted(p.name for p in (group / "takes").iterdir()) == ["000.flac", "001.flac"]
    assert [p.name for p in (tmp_path / "groups" / "calm").iterdir()] == ["p1"]


def test_verify_reports_missing_extra_and_mismatched_takes(tmp_path):
    group = tmp_path / "groups" / "calm" / "p1"
    write_group(group, audios(3), SR, rows_for(group, 3))
    (group / "takes" / "000.flac").unlink()
    sf.write(group / "takes" / "007.flac", np.zeros(SR, np.float32), SR)
    sf.write(group / "takes" / "002.flac", np.zeros(SR, np.float32), SR)  # 1 s, row says 0.5 s
    (tmp_path / "groups" / "calm" / ".p2.partial-dead").mkdir()
    problems, warnings, checked = verify_results(tmp_path)
    text = "\n".join(problems)
    assert checked == 1
    assert "000.flac does not exist" in text
    assert "007.flac: no row" in text
    assert "002.flac: 1.0000 s on disk != row 0.5000 s" in text
    assert len(problems) == 3
    assert any(".p2.partial-dead" in w for w in warnings)


def test_verify_flags_group_without_scores(tmp_path):
    (tmp_path / "groups" / "calm" / "p1" / "takes").mkdir(parents=True)
    problems, _, _ = verify_results(tmp_path)
    assert problems == [f"{tmp_path / 'groups/calm/p1'}: no scores.parquet"]


def test_write_threads_sized_from_the_cpus_this_process_may_use(monkeypatch):
    from bestofn.core import groupio

    for cpus, want in ((2, 4), (12, 6), (128, 8)):
        monkeypatch.setattr(groupio.os, "sched_getaffinity", lambda _pid, n=cpus: set(range(n)))
        assert groupio.write_threads(None) == want
    assert groupio.write_threads(3) == 3  # runtime.write_threads, as given


def test_the_write_threads_change_no_byte_of_a_group(tmp_path):
    takes = audios(6)
    files = {}
    for threads in (1, 5):
        group = tmp_path / f"t{threads}" / "calm" / "p1"
        write_group(group, takes, SR, rows_for(group, 6), io_threads=threads)
        files[threads] = [p.read_bytes() for p in sorted((group / "takes").iterdir())]
    assert files[1] == files[5] and len(files[1]) == 6


def test_runtime_write_threads_reach_the_worker_and_its_key():
    from bestofn.worker.client.runtime import Runtime

    options = Runtime.from_config({"write_threads": 12}).worker_options("/tmp/r")
    assert options.write_threads == 12
    assert options.serving()["write_threads"] == 12  # a worker started with another count goes
    assert Runtime.from_config({}).worker_options("/tmp/r").write_threads is None
