"""The fused pipeline for one group: generate -> restore -> score -> write, audio kept in memory.

A plain function of (spec, loaded backends, output dir), so the group job can call it directly
and the warm per-GPU worker can call it for every group it serves."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from bestofn import __version__
from bestofn.audio import mono_at
from bestofn.backends import registry
from bestofn.backends.base import Generator, Restorer, Scorer, Take
from bestofn.groupio import TAKES, take_name, write_group
from bestofn.spec import GroupSpec

ARROW_TYPES = {
    "DOUBLE": pa.float64(),
    "FLOAT": pa.float32(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
}


# How a take ended (column ``stop_reason``): the stop head fired ('eos'), the frame budget cut
# it ('budget', and ``truncated`` is true), or it has no audio at all ('empty').
STOP_REASONS = ("eos", "budget", "empty")
# An empty take is published as this much digital silence (a 0-frame FLAC does not decode);
# its row says stop_reason 'empty' and n_frames 0, and duration_s is the silence's length.
EMPTY_TAKE_S = 0.25


def take_ending(take: Take, generator: str) -> dict:
    """``n_frames``, ``truncated`` and ``stop_reason`` of one take, from its meta.

    A generator without codec frames (piper) leaves ``n_frames`` unset (NULL). A take with no
    audio samples is 'empty' whatever its meta says; a truncated one is 'budget'."""
    meta = take.meta or {}
    n_frames = meta.get("n_frames")
    truncated = bool(meta.get("truncated", False))
    reason = meta.get("stop_reason")
    if np.asarray(take.audio).shape[0] == 0:
        reason = "empty"
    elif reason is None:
        reason = "budget" if truncated else "eos"
    if reason not in STOP_REASONS or (truncated and reason == "eos"):
        raise RuntimeError(
            f"generator {generator!r}: take with seed {take.seed} says stop_reason {reason!r}, "
            f"truncated {truncated}; expected one of {STOP_REASONS} ('budget' when truncated)"
        )
    return {
        "n_frames": None if n_frames is None else int(n_frames),
        "truncated": truncated and reason == "budget",
        "stop_reason": reason,
    }


def _silence_like(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    n = max(1, int(round(EMPTY_TAKE_S * sample_rate)))
    return np.zeros((n, *np.asarray(audio).shape[1:]), dtype=np.float32)


def stable_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _strip_runtime(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "runtime"}


def models_identity(models: dict) -> dict:
    """The models section without each backend's ``runtime`` knobs (batch sizes, threads,
    compile flags): what makes a take, and so what a group's params and hashes include."""
    out = {}
    for role, value in models.items():
        if role == "scorers":
            out[role] = [_strip_runtime(s) for s in value]
        else:
            out[role] = _strip_runtime(value) if isinstance(value, dict) else value
    return out


def _kwargs(entry: dict) -> dict:
    return {**(entry.get("options") or {}), **(entry.get("runtime") or {})}


@dataclass
class Backends:
    generator: Generator
    restorer: Restorer
    scorers: list[Scorer]
    models: dict  # the model section of the config these were built from (identity)
    load_s: float = 0.0
    provenance: dict = field(default_factory=dict)

    @property
    def models_hash(self) -> str:
        return stable_hash(models_identity(self.models))


def load_backends(models: dict, device: str = "cpu") -> Backends:
    """Build every backend named in the config's ``models`` section, once.

    The weight files' facts are compared first (nothing loads on a mismatch), the rates between
    the loaded stages after (bestofn.agreement): either raises AgreementError naming both."""
    from bestofn import agreement

    agreement.check_files(models)
    t0 = time.perf_counter()
    gen = models["generator"]
    rest = models.get("restorer") or {"backend": "identity"}
    generator = registry.build("generator", gen["backend"], _kwargs(gen), device)
    restorer = registry.build("restorer", rest["backend"], _kwargs(rest), device)
    scorers = [
        registry.build("scorer", s["backend"], _kwargs(s), device)
        for s in models.get("scorers", [])
    ]
    seen: dict[str, str] = {}
    for s in scorers:
        for col in s.columns:
            if col in seen:
                raise ValueError(f"scorers {seen[col]!r} and {s.name!r} both write column {col!r}")
            seen[col] = s.name
    backends = Backends(generator, restorer, scorers, models)
    agreement.check_loaded(backends)
    provenance = {
        "generator": generator.provenance(),
        "restorer": restorer.provenance(),
        "scorers": [s.provenance() for s in scorers],
    }
    backends.provenance = provenance
    backends.load_s = time.perf_counter() - t0
    return backends


def _check_scores(scorer: Scorer, scores: dict, n: int) -> None:
    for col in scorer.columns:
        if col not in scores:
            raise RuntimeError(f"scorer {scorer.name!r} returned no column {col!r}")
        if len(scores[col]) != n:
            raise RuntimeError(
                f"scorer {scorer.name!r} column {col!r} has {len(scores[col])} values for {n} takes"
            )


@functools.cache
def device_label(device: str) -> str:
    """``device`` as the host numbers it, with the GPU's name: a worker started with
    ``CUDA_VISIBLE_DEVICES=3`` runs on its ``cuda:0``, and its rows say ``cuda:3 NVIDIA H200``,
    so the throughput table shows which physical GPU served each group."""
    if not device.startswith("cuda"):
        return device
    import torch

    index = torch.device(device).index or 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    host_index = visible[index] if index < len(visible) and visible[index] else str(index)
    return f"cuda:{host_index} {torch.cuda.get_device_name(index)}"


def run_group(
    spec: GroupSpec,
    backends: Backends,
    group_dir: Path,
    *,
    flac_subtype: str = "PCM_16",
    charged_load_s: float | None = None,
    worker_idle_s: float = 0.0,
    device: str = "cpu",
    worker_slot: int = -1,
    paths_relative_to: Path | None = None,
) -> dict:
    """Generate, restore, score and atomically write one group. Returns its stage timings.

    ``charged_load_s`` is the model-load time attributed to this group (the whole load when the
    group's own process loaded the models; 0 for later groups on a warm worker).
    ``flac_path`` is recorded relative to ``paths_relative_to`` (the workflow's working
    directory; default: this process's)."""
    group_dir = Path(group_dir)
    started = datetime.now(UTC)
    t = {}

    t0 = time.perf_counter()
    takes = backends.generator.generate(spec)
    if len(takes) != spec.n_takes:
        raise RuntimeError(f"generator returned {len(takes)} takes, expected {spec.n_takes}")
    endings = [take_ending(tk, backends.generator.name) for tk in takes]
    gen_rate = backends.generator.sample_rate
    raw = [
        _silence_like(tk.audio, gen_rate) if end["stop_reason"] == "empty" else tk.audio
        for tk, end in zip(takes, endings, strict=True)
    ]
    t["generate_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    audios, sr = backends.restorer.restore(raw, gen_rate)
    t["restore_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    # Resample once per rate that scorers ask for; every scorer asking for 16 kHz shares it.
    at_rate: dict[int, list[np.ndarray]] = {}
    scores: dict[str, list] = {}
    score_seconds: dict[str, float] = {}
    for scorer in backends.scorers:
        ts = time.perf_counter()
        want = scorer.input_sample_rate
        if want is None:
            inputs, rate = audios, sr
        else:
            if want not in at_rate:
                at_rate[want] = mono_at(audios, sr, want)
            inputs, rate = at_rate[want], want
        out = scorer.score(inputs, rate, spec)
        _check_scores(scorer, out, len(audios))
        scores.update({c: out[c] for c in scorer.columns})
        score_seconds[scorer.name] = time.perf_counter() - ts
    t["score_s"] = time.perf_counter() - t0

    load_s = backends.load_s if charged_load_s is None else charged_load_s
    rows = _rows(spec, takes, endings, audios, sr, scores, backends, group_dir, paths_relative_to)
    fixed = {
        "group_generate_s": t["generate_s"],
        "group_restore_s": t["restore_s"],
        "group_score_s": t["score_s"],
        "group_load_s": load_s,
        "worker_idle_s": worker_idle_s,
        "score_seconds": json.dumps(score_seconds),
        "device": device_label(device),
        "worker_slot": worker_slot,  # -1: models loaded in the group's own process
        "worker_pid": os.getpid(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),  # '' outside SLURM
        "started_at": started,
    }
    for name, value in fixed.items():
        rows = rows.append_column(name, pa.array([value] * rows.num_rows))
    write_started = time.perf_counter()

    def add_write_timing(table: pa.Table) -> pa.Table:
        # Called by write_group after the FLACs are on disk, just before the parquet is written.
        now = datetime.now(UTC)
        t["write_s"] = time.perf_counter() - write_started
        t["wall_s"] = (now - started).total_seconds()
        for name, value in (
            ("group_write_s", t["write_s"]),
            ("group_wall_s", t["wall_s"]),
            ("finished_at", now),
        ):
            table = table.append_column(name, pa.array([value] * table.num_rows))
        return table

    write_group(group_dir, audios, sr, rows, flac_subtype=flac_subtype, finalize=add_write_timing)
    return t


def _rows(
    spec, takes, endings, audios, sr, scores, backends: Backends, group_dir: Path, relative_to
) -> pa.Table:
    n = len(audios)
    provenance = json.dumps(backends.provenance, sort_keys=True)
    base = Path(relative_to) if relative_to is not None else Path.cwd()
    takes_dir = Path(os.path.relpath(Path(group_dir).absolute() / TAKES, base.absolute()))
    cols = {
        "group_id": pa.array([spec.group_id] * n),
        "emotion": pa.array([spec.emotion] * n),
        "prompt_id": pa.array([spec.prompt_id] * n),
        "take": pa.array(range(n), pa.int32()),
        "seed": pa.array([tk.seed for tk in takes], pa.int64()),
        "text": pa.array([spec.text] * n),
        "flac_path": pa.array([str(takes_dir / take_name(i)) for i in range(n)]),
        "duration_s": pa.array([a.shape[0] / sr for a in audios], pa.float64()),
        "sample_rate": pa.array([sr] * n, pa.int32()),
        "channels": pa.array([1 if a.ndim == 1 else a.shape[1] for a in audios], pa.int32()),
        "n_frames": pa.array([e["n_frames"] for e in endings], pa.int32()),
        "truncated": pa.array([e["truncated"] for e in endings], pa.bool_()),
        "stop_reason": pa.array([e["stop_reason"] for e in endings], pa.string()),
        "reference_audio": pa.array([spec.reference_audio or ""] * n),
    }
    for scorer in backends.scorers:
        for col, typ in scorer.columns.items():
            cols[col] = pa.array(scores[col], ARROW_TYPES.get(typ.upper()))
    cols.update(
        {
            "generator": pa.array([backends.generator.name] * n),
            "models": pa.array([provenance] * n),
            "models_hash": pa.array([backends.models_hash] * n),
            "spec_hash": pa.array([stable_hash(asdict(spec))] * n),
            "bestofn_version": pa.array([__version__] * n),
            "host": pa.array([socket.gethostname()] * n),
        }
    )
    return pa.table(cols)
