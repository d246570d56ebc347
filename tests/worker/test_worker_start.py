"""A worker's start (issue 24): backends built in threads and a warm-up before ready change no
take, and the worker says where its start and each group's memory went.

One tiny production-shaped set (moss-fast with its v2 codec, VoiceCLAP, Empathic-Insight: their
imports go through the one import thread) runs one group twice: loaded one backend after the
other in this process with no warm-up, and through a worker started as a group job starts one,
with ``parallel_load``, ``warm_up`` and ``cache_dir`` on."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from helpers import tiny_config, write_tsv

pytestmark = pytest.mark.slow  # groups through started workers, each backend loaded


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    from bestofn.fakes import empathic, moss, voiceclap

    out = tmp_path_factory.mktemp("weights")
    gen = moss.write(out, "tiny", 0, p_stop=1e-9)
    return {
        "generator": {
            "backend": "moss-fast",
            "options": {**gen, "min_frames": 6, "max_frames": 6},
            "runtime": {"batch_size": 2, "decode_batch_size": 2},
        },
        "restorer": {"backend": "identity"},
        "scorers": [
            {"backend": "duration"},
            {
                "backend": "voiceclap",
                "options": {**voiceclap.write(out, "tiny", 0), "window_s": 1.0},
            },  # fmt: skip
            {"backend": "empathic-insight", "options": empathic.write(out, "tiny", 0)},
        ],
    }


def group_files(out):
    takes = {p.name: p.read_bytes() for p in sorted((out / "takes").glob("*.flac"))}
    table = pq.read_table(out / "scores.parquet").to_pylist()
    keep = [c for c in table[0] if c.startswith(("vc_", "ei_", "duration", "seed", "n_frames"))]
    return takes, [{c: nan_equal(r[c]) for c in keep} for r in table], table[0]["models"]


def nan_equal(value):
    """A score as compared: NaN (``ei_target`` of an emotion with no head) equal to NaN, every
    other value as it is (bit-identical floats)."""
    return "NaN" if isinstance(value, float) and value != value else value


def test_threads_and_warm_up_change_no_take(project, weights):
    from bestofn.core.pipeline import load_backends
    from bestofn.core.plan import build_plan
    from bestofn.core.runner import run_group
    from bestofn.util.spec import GroupSpec
    from bestofn.worker.client.group_job import health, run_group_via_worker, stop_all

    write_tsv(project / "config/emotions.tsv", ["emotion", "description"], [["calm", "Calm."]])
    write_tsv(project / "config/prompts.tsv", ["prompt_id", "text"], [["p1", "Good day."]])
    state = project / "state"
    runtime = {"state_dir": str(state), "idle_timeout_s": 60, "parallel_load": True,
               "warm_up": True, "cache_dir": "cache",
               "experimental": {"generate_priority": "high"}}  # fmt: skip
    plan = build_plan(tiny_config(takes=2, models=weights, runtime=runtime), base=project)
    params = plan.group_params("calm", "p1")
    results = project / "results"

    serial = load_backends(weights, "cpu", parallel=False)
    assert serial.load_report["parallel"] is False
    alone = project / "alone"
    run_group(GroupSpec(**json.loads(params)), serial, alone)

    out = results / "groups" / "calm" / "p1"
    cwd = os.getcwd()
    os.chdir(project)
    try:
        run_group_via_worker(params, json.dumps(weights), str(out), "cpu", runtime, str(results))
        h = health(str(state / "slot0.sock"))
    finally:
        os.chdir(cwd)
        stop_all(state)
    assert group_files(out) == group_files(alone)  # FLAC bytes, scores, provenance

    report = h["load_report"]
    assert report["parallel"] is True
    gen = report["backends"]["generator:moss-fast"]
    assert {"read_s", "place_s", "checkpoint_s", "codec_s", "compile_setup_s"} <= set(gen["parts"])
    assert set(report["backends"]) == {"generator:moss-fast", "restorer:identity",
                                       "scorer0:duration", "scorer1:voiceclap",
                                       "scorer2:empathic-insight"}  # fmt: skip
    start = h["start"]
    assert start["generate_priority"] == "high"  # the config's, through the client and CLI
    assert start["warm_up_s"] and set(start["warm_up_s"]) >= {"generate", "restore", "score"}
    assert 0 < start["load_done_s"] <= start["warm_up_done_s"] <= start["ready_s"]
    assert h["last_group"]["group_id"] == "calm/p1" and h["last_group"]["host_rss_mib"] > 0
    assert h["last_group"]["engine"]["states"] == 1  # the warm-up's decode state, reused

    # the first group is charged the load and the warm-up
    charged = pq.read_table(out / "scores.parquet", columns=["group_load_s"])[0][0].as_py()
    assert charged == pytest.approx(h["load_s"])
    assert charged > report["load_s"] + sum(start["warm_up_s"].values()) * 0.99

    log = (results / "logs/workers/slot0.log").read_text()
    for tag in ("load ", "worker-start ", "group-stats "):
        assert f" {tag}{{" in log, tag
    assert any((results / "cache/sha256-memo").iterdir())  # weight hashes memoised


def test_a_failing_backend_fails_the_parallel_load_with_its_own_error(weights):
    from bestofn.core.pipeline import load_backends

    models = json.loads(json.dumps(weights))
    models["scorers"][2]["options"]["heads_path"] = "/nowhere"
    with pytest.raises(Exception, match="/nowhere") as serial:
        load_backends(models, "cpu", parallel=False)
    with pytest.raises(type(serial.value), match="/nowhere"):
        load_backends(models, "cpu", parallel=True)


def test_imports_go_in_preload_order_and_backends_without_imports_do_not_wait(monkeypatch):
    """The import thread takes the backends' ``preload_rank`` order, not the config's;
    moss-fast and duration, which import nothing there, are built while NeMo still imports,
    wherever they stand in the config."""
    import threading

    from bestofn.backends import loading, registry

    order, built = [], []
    no_imports = {"moss-fast", "duration"}
    both_built = threading.Event()

    def preload(name):
        order.append(name)
        if name == "parakeet":  # the first import still runs while those two are built
            assert both_built.wait(10), f"built during NeMo's import: {built}"

    def build(role, name, kwargs, device):
        built.append(name)
        if no_imports <= set(built):
            both_built.set()
        return type("Built", (), {"provenance": lambda self: {}})()

    monkeypatch.setattr(loading, "preload", preload)
    monkeypatch.setattr(registry, "build", build)
    monkeypatch.setattr(registry, "backend_class", lambda role, name: None)
    entries = [("generator", "moss-fast", {}), ("restorer", "sidon", {}),
               ("scorer", "parakeet", {}), ("scorer", "voiceclap", {}),
               ("scorer", "empathic-insight", {}), ("scorer", "duration", {})]  # fmt: skip
    loading.build_all(entries, "cpu", parallel=True)
    assert order == ["empathic-insight", "parakeet", "sidon", "voiceclap"]
    assert no_imports <= set(built)  # and both were built while NeMo imported (preload waits)
    # serial: the same imports first, then the builds in config order
    order.clear(), built.clear()
    loading.build_all(entries, "cpu", parallel=False)
    assert built == [name for _, name, _ in entries]


@pytest.mark.parametrize("arch", ["local", "delay"])
def test_builds_that_run_beside_a_from_pretrained_do_not_depend_on_the_default_dtype(
    weights, arch, tmp_path
):
    """moss-fast's ``parallel_build`` claim (Local with its v2 codec, Delay with
    its v1 codec): it may build while another thread's ``from_pretrained`` has set torch's
    default dtype to bfloat16, so building it under that default gives every tensor the bits
    and dtype of a normal build."""
    import torch

    from bestofn.backends import registry
    from bestofn.core.pipeline import backend_kwargs

    gen = weights["generator"]
    if arch == "delay":
        from bestofn.fakes import moss_audio_tokenizer, moss_delay

        moss_audio_tokenizer.write(tmp_path / "MOSS-Audio-Tokenizer", "tiny", 0)
        options = {**moss_delay.write(tmp_path, "tiny", 0), "min_frames": 6, "max_frames": 6}
        gen = {**gen, "options": options}

    def tensors(obj, path="", seen=None, out=None):  # every tensor reachable from obj
        seen, out = (set(), {}) if seen is None else (seen, out)
        if id(obj) in seen or len(path) > 200:
            return out
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out[path] = obj
        elif isinstance(obj, torch.nn.Module):
            for name, t in [*obj.named_parameters(), *obj.named_buffers()]:
                out[f"{path}.{name}"] = t
            for name, value in vars(obj).items():
                if not name.startswith("_"):
                    tensors(value, f"{path}.{name}", seen, out)
        elif isinstance(obj, (list, tuple)):
            for i, value in enumerate(obj):
                tensors(value, f"{path}[{i}]", seen, out)
        elif isinstance(obj, dict):
            for key, value in obj.items():
                tensors(value, f"{path}[{key!r}]", seen, out)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("bestofn"):
            for name, value in vars(obj).items():
                tensors(value, f"{path}.{name}", seen, out)
        return out

    plain = tensors(registry.build("generator", "moss-fast", backend_kwargs(gen), "cpu").model)
    plain |= tensors(
        registry.build("generator", "moss-fast", backend_kwargs(gen), "cpu").codec, "c"
    )
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        built = registry.build("generator", "moss-fast", backend_kwargs(gen), "cpu")
        under_bf16 = tensors(built.model) | tensors(built.codec, "c")
    finally:
        torch.set_default_dtype(before)
    assert plain.keys() == under_bf16.keys() and len(plain) > 20
    for name, t in plain.items():
        assert t.dtype == under_bf16[name].dtype and torch.equal(t, under_bf16[name]), name
    assert registry.builds_beside_others("moss-fast")


def test_builds_that_use_process_wide_torch_state_run_one_at_a_time(monkeypatch):
    """A build without ``parallel_build`` that sets torch's default dtype for a while (as
    ``from_pretrained`` does) never overlaps another such build: the other's module gets
    float32, and the default is float32 after the load."""
    import threading
    import time

    import torch

    from bestofn.backends import loading, registry

    started = threading.Event()
    made = {}

    def build(role, name, kwargs, device):
        if name == "sidon":  # as transformers' local_torch_dtype: set, build, restore
            started.set()
            before = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            time.sleep(0.3)
            torch.set_default_dtype(before)
        if name == "voiceclap":
            started.wait(5)
            made["voiceclap"] = torch.nn.Linear(2, 2).weight.dtype
        return type("Built", (), {"provenance": lambda self: {}})()

    monkeypatch.setattr(loading, "preload", lambda name: None)
    monkeypatch.setattr(registry, "build", build)
    monkeypatch.setattr(registry, "backend_class", lambda role, name: None)
    entries = [("generator", "moss-fast", {}), ("restorer", "sidon", {}),
               ("scorer", "voiceclap", {})]  # fmt: skip
    _, _, report = loading.build_all(entries, "cpu", parallel=True)
    assert made["voiceclap"] == torch.float32
    sidon, vc = report["backends"]["restorer:sidon"], report["backends"]["scorer0:voiceclap"]
    assert sidon["end_s"] <= vc["start_s"] or vc["end_s"] <= sidon["start_s"]
    assert torch.get_default_dtype() == torch.float32


def test_a_parallel_load_hands_the_gil_on_sooner_and_restores_the_interval(monkeypatch):
    """During a parallel load the builds and the import thread run with the short GIL switch
    interval (``loading.SWITCH_INTERVAL_S``); afterwards, and after a failed build, the caller's
    interval is back. A serial load leaves it alone."""
    import sys

    from bestofn.backends import loading, registry

    seen = {}

    def preload(name):
        seen["import"] = sys.getswitchinterval()

    def build(role, name, kwargs, device):
        seen[name] = sys.getswitchinterval()
        if kwargs.get("fail"):
            raise RuntimeError(f"{name} failed")
        return type("Built", (), {"provenance": lambda self: {}})()

    monkeypatch.setattr(loading, "preload", preload)
    monkeypatch.setattr(registry, "build", build)
    monkeypatch.setattr(registry, "backend_class", lambda role, name: None)
    before = sys.getswitchinterval()
    assert before != loading.SWITCH_INTERVAL_S
    entries = [("generator", "moss-fast", {}), ("scorer", "parakeet", {})]
    loading.build_all(entries, "cpu", parallel=True)
    assert seen == {"import": loading.SWITCH_INTERVAL_S, "moss-fast": loading.SWITCH_INTERVAL_S,
                    "parakeet": loading.SWITCH_INTERVAL_S}  # fmt: skip
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError, match="parakeet failed"):
        loading.build_all([entries[0], ("scorer", "parakeet", {"fail": True})], "cpu", True)
    assert sys.getswitchinterval() == before
    seen.clear()
    loading.build_all(entries, "cpu", parallel=False)
    assert seen["moss-fast"] == seen["parakeet"] == before
