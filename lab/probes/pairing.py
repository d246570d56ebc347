"""Two groups per generate call on one GPU: are a group's takes the same alone and
paired, and what does a clip cost each way?

moss-fast at the real MOSS-TTS-Local v1.5 4B shape with random weights built on the device
(``bestofn.fakes.moss.build``: the stop head always continues, so every take runs to its
budget; min = max frames fixes the budget), compiled + CUDA graphs as production runs it. Two
generators share the one model: pairing off (today's path: one group per call, batch = its
takes) and ``pair_groups: true`` (every call 2 x takes rows).

(a) invariance, group A's codes: alone in the pair shape, beside B, beside C (A in the second
    half; B and C: other texts of A's prompt bucket, other seeds), beside B with 64 more frames
    of budget (a larger state, the loop running on past A); also, for information, A
    through today's path and A in a plain left-padded batch with B (the naive pairing);
(b) speed, s/clip of a group of ``takes``: today's path, alone in the pair shape, and paired
    (the pair call's time over both groups' clips), each the best of ``repeats`` calls after
    a warm-up call (compiles, graph captures).

Prints one line per figure and writes ``pairing.json`` to OUT.

    PYTHONPATH=src python3 -m lab.probes.pairing OUT            # CUDA, real size
    PYTHONPATH=src python3 -m lab.probes.pairing OUT --tiny     # any device, smoke test
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import torch

from bestofn.util.spec import GroupSpec

# three lengths within one 64-row bucket of the byte-token prompt (checked below), so the
# prompts end at the bucket from different offsets
TEXTS = {
    "A": "The quick brown fox jumps over the lazy dog by the river.",
    "B": "She sells sea shells by the quiet shore.",
    "C": "Seven swans swam past the old stone bridge, slowly.",
}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _equal(x: list[torch.Tensor], y: list[torch.Tensor]) -> dict:
    same = [torch.equal(a, b) for a, b in zip(x, y, strict=True)]
    first = next((i for i, s in enumerate(same) if not s), None)
    diff = None
    if first is not None:  # where the first differing take parts
        a, b = x[first], y[first]
        n = min(len(a), len(b))
        rows = (a[:n] != b[:n]).any(-1).nonzero()
        diff = {"take": first, "first_frame": int(rows[0]) if len(rows) else n}
    return {"equal": all(same), "takes_equal": sum(same), "takes": len(same), "first_diff": diff}


def _timed(fn, device: str, repeats: int) -> tuple[float, float, object]:
    """(first call s, best of ``repeats`` s, last result)."""
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return first, best, out


def run(out_dir: Path, device: str, size: str, takes: int, frames: int, repeats: int) -> dict:
    from bestofn.backends.moss_fast import MossFastGenerator
    from bestofn.fakes.moss import build
    from bestofn.moss.engine_shell import PairRequest, pair_bucket
    from bestofn.moss.prompt import left_pad

    opts = dict(batch_size=takes, min_frames=frames, max_frames=frames)
    t0 = time.perf_counter()
    off = build(device, size=size, seed=0, **opts)
    on = MossFastGenerator.from_modules(off.model, off.prompt_builder, device=device,
                                        pair_groups=True, **opts)  # fmt: skip
    _sync(device)
    build_s = time.perf_counter() - t0
    specs = {k: GroupSpec(f"e{k}", f"p{k}", text, n_takes=takes) for k, text in TEXTS.items()}
    lengths = {k: int(on.prompt(s).shape[0]) for k, s in specs.items()}
    if len({pair_bucket(n) for n in lengths.values()}) != 1:
        raise SystemExit(f"prompts {lengths} do not share one bucket: change TEXTS")
    A, B, C = specs["A"], specs["B"], specs["C"]
    res: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.node(),
        "torch": torch.__version__, "size": size, "takes": takes, "frames": frames,
        "repeats": repeats, "prompt_rows": lengths, "bucket": pair_bucket(lengths["A"]),
        "build_s": round(build_s, 1),
    }  # fmt: skip
    print(f"# built in {build_s:.1f} s; prompts {lengths}, bucket {res['bucket']}", flush=True)

    # (b) speed first: its warm-up calls compile and capture what (a) replays
    speed = {}
    for name, fn, clips in (
        (f"today_batch{takes}", lambda: off.generate_codes(A), takes),
        ("pair_shape_alone", lambda: on.generate_codes(A), takes),
        ("paired", lambda: on.generate_codes_paired([A, B]), 2 * takes),
    ):
        first, best, _ = _timed(fn, device, repeats)
        speed[name] = {"first_call_s": round(first, 2), "best_s": round(best, 4),
                       "clips": clips, "s_per_clip": round(best / clips, 5)}  # fmt: skip
        print(f"speed {name}: {best / clips:.5f} s/clip ({best:.3f} s per call of {clips} clips; "
              f"first call {first:.1f} s)", flush=True)  # fmt: skip
    res["speed"] = speed
    if device.startswith("cuda"):
        res["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)

    # (a) invariance
    alone = on.generate_codes(A)[0]
    beside_b = on.generate_codes_paired([A, B])[0][0]
    beside_c = on.generate_codes_paired([C, A])[1][0]
    # beside a partner with a longer budget: a larger decode state (other cache strides), the
    # loop running on after A's rows are done
    req = [PairRequest(on.prompt(s), s.seeds(), f) for s, f in ((A, frames), (B, frames + 64))]
    longer = on.engine.generate_pair(req, takes, on.params)[0].codes
    today = off.generate_codes(A)[0]
    rows = on.prompt(A), on.prompt(B)
    ids, mask = left_pad([rows[0]] * takes + [rows[1]] * takes, on.config)
    naive = off.engine.generate(ids, mask, A.seeds() + B.seeds(), frames, off.params).codes[:takes]
    inv = {
        "alone_vs_beside_B": _equal(alone, beside_b),
        "alone_vs_beside_C_second_half": _equal(alone, beside_c),
        "alone_vs_beside_B_longer_budget": _equal(alone, longer),
        "info_alone_vs_today_path": _equal(alone, today),
        "info_today_vs_naive_left_padded_batch": _equal(today, naive),
    }
    res["invariance"] = inv
    res["invariant"] = all(v["equal"] for k, v in inv.items() if k.startswith("alone_vs"))
    for k, v in inv.items():
        print(f"invariance {k}: equal {v['equal']} ({v['takes_equal']}/{v['takes']} takes "
              f"bit-identical; first difference {v['first_diff']})", flush=True)  # fmt: skip
    print(f"INVARIANT {'PASS' if res['invariant'] else 'FAIL'}; paired "
          f"{speed['paired']['s_per_clip']:.5f} s/clip (goal <= 0.011)", flush=True)  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "pairing.json").write_text(json.dumps(res, indent=2))
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tiny", action="store_true", help="tiny random model, any device (smoke)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--takes", type=int, default=None, help="takes per group (64; tiny: 4)")
    ap.add_argument("--frames", type=int, default=None, help="frames per take (188 = 15 s)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not a.tiny and not device.startswith("cuda"):
        raise SystemExit("the real size needs CUDA; --tiny runs anywhere")
    size = "tiny" if a.tiny else "real"
    takes = a.takes or (4 if a.tiny else 64)
    frames = a.frames or (12 if a.tiny else 188)
    run(a.out, device, size, takes, frames, a.repeats)


if __name__ == "__main__":
    main()
