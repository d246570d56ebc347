"""lab.kernel_profile: kernels attributed to the stage that launched them, in a window."""

import gzip
import json

import pytest

from lab import kernel_profile


def _x(name, ts, dur, tid=1, cat="user_annotation", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def _launch(corr, ts, tid=1):
    return _x("cudaLaunchKernel", ts, 1, tid=tid, cat="cuda_runtime", correlation=corr)


def _kernel(name, corr, ts, dur, stream):
    return _x(name, ts, dur, tid=stream, cat="kernel", correlation=corr, stream=stream)


def synthetic_trace():
    """Thread 1: generate (with a nested decode); thread 2: score with parakeet nested, then a
    launch inside score but outside parakeet, then one outside any stage. Marks at 100 and 500;
    a kernel before the window and one that straddles its end."""
    return [
        _x("mark:group-end", 100, 0),
        _x("mark:group-end", 300, 0, tid=2),
        _x("mark:group-end", 500, 0),
        _x("stage:generate", 90, 200),
        _x("stage:codec-decode", 200, 50),
        _launch(1, 95),  # generate, kernel before the window: clipped to nothing
        _launch(2, 120),  # generate
        _launch(3, 210),  # codec-decode
        _x("stage:score", 100, 300, tid=2),
        _x("stage:score:parakeet", 110, 40, tid=2),
        _launch(4, 120, tid=2),  # score:parakeet
        _launch(5, 160, tid=2),  # score (parakeet has ended)
        _launch(6, 450, tid=2),  # no stage
        _kernel("k_before", 1, 10, 20, stream=7),
        _kernel("gemm_gen", 2, 130, 40, stream=7),  # 130-170
        _kernel("decode_attn", 3, 220, 30, stream=7),  # 220-250
        _kernel("asr_enc", 4, 150, 40, stream=13),  # 150-190, overlaps gemm_gen 150-170
        _kernel("clap_gemm", 5, 260, 20, stream=13),  # 260-280
        _kernel("straddle", 6, 490, 30, stream=13),  # 490-520: 10 inside
    ]


def test_kernels_go_to_the_innermost_stage_of_the_launching_thread():
    s = kernel_profile.summarize(synthetic_trace(), clips=2, window=("group-end", "group-end"))
    by = s["kernel_s_per_clip_by_stage"]
    assert by == pytest.approx(
        {
            "generate": 20e-6,
            "codec-decode": 15e-6,
            "score:parakeet": 20e-6,
            "score": 10e-6,
            "(none)": 5e-6,
        }  # fmt: skip
    )
    assert s["window_s"] == pytest.approx(400e-6)
    # kernels 40+30+40+20+10 = 140 us, of which 20 overlap: busy 120 us of 400
    assert s["kernel_s_per_clip"] == pytest.approx(70e-6)
    assert s["gpu_busy_s_per_clip"] == pytest.approx(60e-6)
    assert s["gpu_busy_fraction"] == pytest.approx(0.3)
    assert s["kernel_s_per_clip_by_stream"] == pytest.approx({"7": 35e-6, "13": 35e-6})
    assert s["top_kernels_by_stage"]["generate"][0]["kernel"] == "gemm_gen"


def test_the_whole_trace_without_a_window_and_a_missing_mark_is_named():
    s = kernel_profile.summarize(synthetic_trace(), clips=1)
    assert s["window_s"] == pytest.approx(510e-6)  # first kernel start 10 to last end 520
    assert s["kernel_s_per_clip_by_stage"]["generate"] == pytest.approx(60e-6)
    with pytest.raises(ValueError, match="no marks.*group-start"):
        kernel_profile.summarize(synthetic_trace(), clips=1, window=("group-start", "group-end"))


def test_a_gzipped_trace_loads(tmp_path):
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": synthetic_trace()}, f)
    assert kernel_profile.load_events(path) == synthetic_trace()


def test_bench_pipeline_profile_labels_every_stage_on_cpu(tmp_path):
    """The tiny pipeline under --profile: the trace holds each stage's and scorer's range and
    one group-end mark per group (the ranges come from the product's StageTimer, on the
    groups' own threads), and the results carry the summary."""
    pytest.importorskip("transformers")
    pytest.importorskip("nemo.collections.asr", reason="parakeet needs nemo_toolkit")
    from lab.bench.__main__ import main

    out, prof = tmp_path / "bench.json", tmp_path / "prof"
    argv = "pipeline --size tiny --device cpu --takes 2 --frames 6 --warmup 0 --stream-groups 3"
    argv = [*argv.split(), "--variant", "a:overlap=full", "--gen-option", "pair_groups=true"]
    argv += ["--workdir", str(tmp_path / "work"), "--out", str(out), "--profile", str(prof)]
    assert main(argv) == 0
    events = kernel_profile.load_events(prof / "a.trace.json.gz")
    names = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    for stage in ("generate", "codec-decode", "restore", "score", "score:parakeet",
                  "score:voiceclap", "score:empathic-insight"):  # fmt: skip
        assert "stage:" + stage in names, stage
    assert names.count("mark:group-end") == 3
    (row,) = json.loads(out.read_text())["variants"]
    assert row["kernel_profile"]["clips"] == 4  # the two groups after the first
    assert json.loads(out.read_text())["meta"]["gen_options"] == {"pair_groups": True}
