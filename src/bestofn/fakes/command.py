"""`bestofn fake-weights`: its options (bestofn.fakes.weights writes them)."""

from __future__ import annotations


def _fake_weights(args) -> int:
    from bestofn.fakes.weights import main as fake_weights_main

    return fake_weights_main(args)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fake-weights",
        help="write random-weight checkpoints of every production backend + DIR/config.yaml",
        description="Random-weight checkpoints for every production backend, in the published "
        "on-disk layouts, and DIR/config.yaml: a complete production config pointing at them. "
        "tiny: a CPU test run; real: the published sizes, for GPUs (about 40 GB, 58 with the "
        "Delay model).",
    )
    p.add_argument("dir", help="output directory (created)")
    p.add_argument("--size", choices=["tiny", "real"], default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--p-stop",
        type=float,
        help="MOSS stop probability per frame (default: 0.05 tiny, 0.01 real); a benchmark that "
        "wants every take to run to its frame budget, as `bench pipeline` does, passes 1e-9",
    )
    p.add_argument(
        "--moss-code",
        action="append",
        help="copy of OpenMOSS/MOSS-TTS moss_tts_local_v1.5/ or moss_tts_delay/ (give both: "
        "repeat the option): its remote code is copied into that MOSS checkpoint so moss-hf "
        "loads it too (moss-fast needs none)",
    )
    p.add_argument(
        "--no-delay",
        action="store_true",
        help="skip MOSS-TTS-Delay-v1.5/ (the 8B Delay model: about 17 GB at real size)",
    )
    p.add_argument(
        "--parakeet",
        choices=["plain", "calibrated"],
        default="plain",
        help="which Parakeet DIR/config.yaml points at: the plain random one, or the "
        "CALIBRATION beside it whose joint emits speech's token rate (for speed figures)",
    )
    p.add_argument(
        "--jobs",
        default="auto",
        help="backends written at once, each in its own process; the bytes are the same as "
        "one at a time (default auto: 1 for tiny, else up to one per backend on half the cores)",
    )
    p.set_defaults(func=_fake_weights)
