"""What a worker request may ask for: the bodies of ``POST /v1/groups`` and
``POST /v1/audio/speech`` checked into group specs, each refusal a ``BadRequest`` with the
HTTP status it is answered with."""

from __future__ import annotations

from pathlib import Path

from bestofn.core import speech as speech_io
from bestofn.util.spec import GroupSpec


class BadRequest(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def confined(out: str, results_dir: Path) -> Path:
    """``out`` as an absolute path, refused (403) unless it lies below ``results_dir``."""
    path = Path(out)
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if results_dir not in path.parents:
        raise BadRequest(403, f"out {out!r} is outside the results directory {results_dir}")
    return path


def group_request(body: dict, worker_key: str, results_dir: Path) -> tuple[GroupSpec, Path]:
    """The group spec and output directory of a ``/v1/groups`` body, checked."""
    if body.get("worker_key") != worker_key:
        raise BadRequest(
            409,
            f"worker serves spec {worker_key}, request wants {body.get('worker_key')} "
            "(models, device, flac_subtype and results directory must all match)",
        )
    try:
        spec = GroupSpec(**body["spec"])
    except (KeyError, TypeError) as e:
        raise BadRequest(400, f"bad group spec: {e}") from None
    if not isinstance(spec.n_takes, int) or spec.n_takes < 1:
        raise BadRequest(400, f"n_takes must be a positive integer, got {spec.n_takes!r}")
    if spec.reference_audio:
        ref = Path(spec.reference_audio)
        if not ref.is_file():
            raise BadRequest(400, f"reference_audio {spec.reference_audio!r} does not exist")
    return spec, confined(str(body.get("out", "")), results_dir)


def speech_request(body: dict, worker_key: str, generator: str) -> tuple[GroupSpec, str]:
    """The one-take spec and response format of a speech body. Fields: ``input``,
    ``response_format`` (wav, flac, pcm), ``model``, ``seed`` (default 0), ``voice``
    ("default" or a label), ``emotion``, ``reference_audio`` (a file; the socket is
    owner-only), and ``emotion_description`` / ``negative_description``; ``worker_key``, when
    given, must be this worker's."""
    key = body.get("worker_key")
    if key is not None and key != worker_key:
        raise BadRequest(409, f"worker serves spec {worker_key}, request wants {key}")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest(400, "'input' must be a non-empty string")
    fmt = body.get("response_format", "wav")
    if fmt not in speech_io.FORMATS:
        raise BadRequest(
            400, f"response_format {fmt!r} not supported; use {', '.join(speech_io.FORMATS)}"
        )
    model = body.get("model", generator)
    if model not in (generator, "bestofn"):
        raise BadRequest(400, f"model {model!r} is not served here ({generator})")
    seed = body.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise BadRequest(400, "'seed' must be a non-negative integer")
    voice = body.get("voice") or "default"
    ref = body.get("reference_audio") or None
    if ref is not None and not Path(ref).is_file():
        raise BadRequest(400, f"reference_audio {ref!r} of voice {voice!r} does not exist")
    texts = {}
    for field in ("emotion", "emotion_description", "negative_description"):
        value = body.get(field) or ""
        if not isinstance(value, str):
            raise BadRequest(400, f"{field!r} must be a string")
        texts[field] = value
    spec = GroupSpec(
        texts["emotion"], "api", " ".join(text.split()), 1, seed,
        reference_audio=ref, emotion_description=texts["emotion_description"],
        negative_description=texts["negative_description"],
    )  # fmt: skip
    return spec, fmt
