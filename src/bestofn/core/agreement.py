"""Generator, codec, restorer and scorers must agree on codebooks and sample rates.

A disagreement does not fail where it is made: a generator emitting codes the codec has no
entry for fails on the GPU as an opaque device-side assert (and breaks the worker's CUDA
context), and audio at the wrong rate is scored without any error at all. So the facts are
compared before any group runs, and a mismatch is an error that names both places:

``check_files(models)``   from the config alone, reading small JSON/YAML files (no model loads):
    - a codec-based generator (options ``model_dir`` + ``codec_dir``, e.g. MOSS): the model's
      ``config.json`` (``n_vq``, ``audio_codebook_sizes`` / ``audio_vocab_size``,
      ``sampling_rate``) against the codec's ``config.json`` (quantizer count, codebook size,
      sampling rate; top level or under ``quantizer_kwargs`` / ``quantizer_config``). The model
      may use fewer codebooks than the codec has (residual quantizers), never more; codebook
      sizes and rates must be equal.
    - a restorer or scorer that declares ``input_sample_rate``: the feature extractor of the
      weights it is given (``preprocessor_config.json`` ``sampling_rate`` in a weights
      directory, ``preprocessor.sample_rate`` in a ``.nemo``'s ``model_config.yaml``) must have
      that rate.
``check_loaded(backends)``   once loaded, the rates between stages: the generator's output rate
    must not be below the restorer's input rate, and the rate after restoration not below
    any scorer's input rate (resampling up cannot create the band the model expects).

A fact a file does not state is not checked (other layouts, your own backends).
"""

from __future__ import annotations

import inspect
import json
import tarfile
from pathlib import Path

import yaml

from bestofn.backends import registry

_NESTED = ("quantizer_kwargs", "quantizer_config", "quantizer")
_COUNT_KEYS = ("num_quantizers", "n_vq", "n_codebooks", "n_q", "num_codebooks")
_SIZE_KEYS = ("codebook_size",)
_RATE_KEYS = ("sampling_rate", "sample_rate")


class AgreementError(ValueError):
    """Two backends (or a backend and its weights) disagree; the message names both places."""


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # missing or unreadable: the backend's own load reports it
    return data if isinstance(data, dict) else None


def _find(cfg: dict, keys: tuple[str, ...]) -> tuple[str, object] | None:
    """(key, value) of the first of ``keys`` at the top level or in a quantizer section."""
    for section in (cfg, *(cfg.get(n) for n in _NESTED)):
        if isinstance(section, dict):
            for key in keys:
                if section.get(key) is not None:
                    return key, section[key]
    return None


def codec_problems(model_dir: Path, codec_dir: Path) -> list[str]:
    """Disagreements between a codec-token generator's config and its codec's config."""
    mfile, cfile = model_dir / "config.json", codec_dir / "config.json"
    model, codec = _json(mfile), _json(cfile)
    if model is None or codec is None:
        return []
    problems = []
    n_vq = model.get("n_vq")
    count = _find(codec, _COUNT_KEYS)
    if n_vq is not None and count is not None and int(n_vq) > int(count[1]):
        problems.append(
            f"codebook count: {mfile} has n_vq = {n_vq}, but {cfile} has {count[0]} = "
            f"{count[1]}: the codec cannot decode {n_vq} codebooks"
        )
    sizes = model.get("audio_codebook_sizes")
    if sizes is None and model.get("audio_vocab_size") is not None:
        sizes = [model["audio_vocab_size"]] * int(n_vq or 1)
        size_field = "audio_vocab_size"
    else:
        size_field = "audio_codebook_sizes"
    size = _find(codec, _SIZE_KEYS)
    if sizes and size is not None and any(int(s) != int(size[1]) for s in sizes):
        problems.append(
            f"codebook size: {mfile} has {size_field} = {model.get(size_field)}, but {cfile} "
            f"has {size[0]} = {size[1]}: codes outside the codec's codebook fail on the GPU as "
            "a device-side assert, and a model trained on another codebook makes noise"
        )
    rate = _find(codec, _RATE_KEYS)
    if model.get("sampling_rate") is not None and rate is not None:
        if int(model["sampling_rate"]) != int(rate[1]):
            problems.append(
                f"sample rate: {mfile} has sampling_rate = {model['sampling_rate']}, but {cfile} "
                f"has {rate[0]} = {rate[1]}"
            )
    return problems


def _nemo_rate(path: Path) -> tuple[str, int] | None:
    """preprocessor.sample_rate of a .nemo archive (uncompressed tar; stops at the config)."""
    try:
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                return None  # gzip-compressed: reading the config would decompress it all
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if Path(member.name).name == "model_config.yaml" and member.isfile():
                    cfg = yaml.safe_load(tar.extractfile(member))
                    rate = ((cfg or {}).get("preprocessor") or {}).get("sample_rate")
                    if rate is None:
                        rate = (cfg or {}).get("sample_rate")
                    return (f"{path} (model_config.yaml)", int(rate)) if rate else None
    except (OSError, tarfile.TarError, yaml.YAMLError, ValueError, TypeError):
        return None
    return None


def weights_rate(path: Path) -> tuple[str, int] | None:
    """(file, sample rate) that a weights path declares for its input audio, if it says."""
    if path.is_dir():
        pre = path / "preprocessor_config.json"
        cfg = _json(pre)
        if cfg is not None and cfg.get("sampling_rate") is not None:
            return str(pre), int(cfg["sampling_rate"])
        return None
    if path.suffix == ".nemo" and path.is_file():
        return _nemo_rate(path)
    return None


def _class_file(cls) -> str:
    try:
        return f"{inspect.getsourcefile(cls)} ({cls.__name__}.input_sample_rate)"
    except TypeError:
        return f"{cls.__module__}.{cls.__name__}.input_sample_rate"


def _is_weights(key: str) -> bool:
    return not key.startswith("cache") and key.endswith(("_path", "_dir"))


def check_files(models: dict, base: Path = Path(".")) -> None:
    """Compare the facts the configured weight files state, before any model loads."""
    base = Path(base)

    def path(value) -> Path:
        p = Path(str(value)).expanduser()
        return p if p.is_absolute() else base / p

    problems = []
    gen = models["generator"]
    options = gen.get("options") or {}
    if options.get("model_dir") and options.get("codec_dir"):
        found = codec_problems(path(options["model_dir"]), path(options["codec_dir"]))
        problems += [f"generator {gen['backend']}: {p}" for p in found]
    stages = [("restorer", models["restorer"])] if models.get("restorer") else []
    stages += [("scorer", s) for s in models.get("scorers", [])]
    for role, entry in stages:
        try:
            cls = registry.backend_class(role, entry["backend"])
        except (registry.UnknownBackend, ImportError):
            continue  # reported by the config checks
        want = getattr(cls, "input_sample_rate", None)
        if not want:
            continue
        for key, value in (entry.get("options") or {}).items():
            if not (_is_weights(key) and isinstance(value, str) and value):
                continue
            declared = weights_rate(path(value))
            if declared is not None and declared[1] != int(want):
                problems.append(
                    f"{role} {entry['backend']}: sample rate: {declared[0]} (options.{key}) "
                    f"says {declared[1]} Hz, but {_class_file(cls)} feeds it {want} Hz"
                )
    if problems:
        raise AgreementError(
            "backends disagree (fix the config or the weights; nothing has run):\n  "
            + "\n  ".join(problems)
        )


def _source(backend) -> str:
    model_dir = getattr(backend, "model_dir", None)
    if model_dir and (Path(model_dir) / "config.json").is_file():
        return str(Path(model_dir) / "config.json")
    try:
        return str(inspect.getsourcefile(type(backend)))
    except TypeError:
        return type(backend).__qualname__


def check_loaded(backends) -> None:
    """Rates between loaded stages: generator -> restorer -> scorers."""
    gen, restorer = backends.generator, backends.restorer
    problems = []
    rate = int(gen.sample_rate)
    want = getattr(restorer, "input_sample_rate", None)
    if want and rate < int(want):
        problems.append(
            f"generator {gen.name} makes {rate} Hz audio ({_source(gen)}), but restorer "
            f"{restorer.name} expects {want} Hz input ({_source(restorer)}): upsampling cannot "
            "restore a band the audio never had"
        )
    out = getattr(restorer, "output_sample_rate", None) or getattr(restorer, "sample_rate", None)
    out = int(out) if out else rate
    where = f"after restorer {restorer.name} ({_source(restorer)})"
    for scorer in backends.scorers:
        want = getattr(scorer, "input_sample_rate", None)
        if want and out < int(want):
            problems.append(
                f"scorer {scorer.name} expects {want} Hz input ({_source(scorer)}), but the "
                f"audio is {out} Hz {where}"
            )
    if problems:
        raise AgreementError(
            "backends disagree on sample rates (nothing has run):\n  " + "\n  ".join(problems)
        )
