"""Backends chosen by name in config, found by what their modules declare.

Each backend module of this package says what it provides in one literal assignment, read from
its text without importing it (``bestofn.util.declared``), so naming a backend never imports
the heavy libraries of the others (nemo, transformers, onnxruntime...) nor their modules (which
import torch at their top)::

    BACKENDS = {
        "parakeet": {                 # the name a config gives
            "role": "scorer",         # generator | restorer | scorer
            "class": "ParakeetScorer",  # the class in this module (or package)
            # optional: what its build imports beyond its module, "module" or "module:Attr,Attr"
            # (a lazy package's attributes import their modules), and the place of that import
            # in the worker's import thread (bestofn.backends.loading; lower first)
            "preload": ("omegaconf", "nemo.collections.asr.models:ASRModel"),
            "preload_rank": 1,
            # optional: its build may run beside another's (see ``builds_beside_others``)
            "parallel_build": False,
        },
    }

A module's ``PUBLISHED_WEIGHTS`` (read the same way) lists the hub checkpoints it reads
(bestofn.weights.manifest). Everything else a backend declares sits on its class (columns,
directions, table rows, plan checks): the plan imports the classes the config names.

A config may also name its own backend by import path, ``package.module:Class`` (a plugin:
any importable class deriving from the role's base class in ``bestofn.backends.base``)."""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from pathlib import Path

from bestofn.backends.base import Generator, Restorer, Scorer
from bestofn.util.declared import DeclarationError, declarations

ROLE_BASE = {"generator": Generator, "restorer": Restorer, "scorer": Scorer}
# a config without a restorer keeps the takes as generated
DEFAULT_RESTORER = "identity"
LAST = 100  # the preload_rank of a backend that declares none: after those that do


@dataclass(frozen=True)
class Declared:
    role: str
    name: str
    target: str  # "module:Class"
    preload: tuple[str, ...] = ()
    preload_rank: int = LAST
    parallel_build: bool = False


_KEYS = {"role", "class", "preload", "preload_rank", "parallel_build"}


@functools.cache
def _declarations() -> dict[str, list[tuple[str, object]]]:
    return declarations(Path(__file__).parent, __package__, ("BACKENDS", "PUBLISHED_WEIGHTS"))


@functools.cache
def declared() -> dict[str, Declared]:
    """Every backend this package declares, by name: generators, restorers, scorers, each
    role's by name."""
    found: dict[str, Declared] = {}
    for module, backends in _declarations()["BACKENDS"]:
        for name, d in backends.items():
            ok = isinstance(d, dict) and d.get("role") in ROLE_BASE and "class" in d
            if not ok or set(d) - _KEYS:
                raise DeclarationError(
                    f"{module}: BACKENDS[{name!r}] needs role ({', '.join(ROLE_BASE)}) and "
                    f"class, and may have only {', '.join(sorted(_KEYS))}"
                )
            if name in found:
                raise DeclarationError(f"backend {name!r} declared by {found[name].target} "
                                       f"and by {module}")  # fmt: skip
            found[name] = Declared(
                d["role"], name, f"{module}:{d['class']}", tuple(d.get("preload", ())),
                d.get("preload_rank", LAST), bool(d.get("parallel_build", False)),
            )  # fmt: skip
    roles = list(ROLE_BASE)
    return dict(sorted(found.items(), key=lambda kv: (roles.index(kv[1].role), kv[0])))


@functools.cache
def published_weights() -> tuple[tuple[str, dict], ...]:
    """(backend name, entry) for each hub checkpoint a backend module declares it reads
    (``PUBLISHED_WEIGHTS``: dicts of name, repo_id, revision, allow_patterns, folder, and
    optionally size_bytes, note and backend, which defaults to the module's one backend), in
    the order of ``declared()``. bestofn.weights.manifest makes its table of them."""
    by_module: dict[str, list[tuple[str, dict]]] = {}
    owners: dict[str, list[str]] = {}
    for name, d in declared().items():
        owners.setdefault(d.target.partition(":")[0], []).append(name)
    for module, entries in _declarations()["PUBLISHED_WEIGHTS"]:
        for e in entries:
            backend = e.get("backend") or (owners.get(module) or [None])[0]
            if backend not in declared() or set(e) - _WEIGHT_KEYS or not _WEIGHT_NEEDS <= set(e):
                raise DeclarationError(
                    f"{module}: PUBLISHED_WEIGHTS entry {e.get('name')!r} needs "
                    f"{', '.join(sorted(_WEIGHT_NEEDS))} and may have only "
                    f"{', '.join(sorted(_WEIGHT_KEYS))}; its backend must be declared"
                )
            by_module.setdefault(module, []).append((backend, e))
    order = list(dict.fromkeys(d.target.partition(":")[0] for d in declared().values()))
    order += [m for m in by_module if m not in order]
    return tuple(item for module in order for item in by_module.get(module, ()))


_WEIGHT_NEEDS = {"name", "repo_id", "revision", "allow_patterns", "folder"}
_WEIGHT_KEYS = _WEIGHT_NEEDS | {"size_bytes", "note", "backend"}


@functools.cache
def registered() -> dict[str, dict[str, str]]:
    """role -> {name: "module:Class"}, every role present. Shared: do not modify."""
    out: dict[str, dict[str, str]] = {role: {} for role in ROLE_BASE}
    for name, d in declared().items():
        out[d.role][name] = d.target
    return out


def preload_targets(name: str) -> tuple[str, ...]:
    """What backend ``name`` imports when it is built, beyond its own module.
    bestofn.backends.loading imports these in one thread while other backends read their
    weights, in ``preload_rank`` order (not the config's)."""
    d = declared().get(name)
    return d.preload if d else ()


def preload_rank(name: str) -> int:
    """The place of backend ``name``'s preload in the import thread (lower first)."""
    d = declared().get(name)
    return d.preload_rank if d else LAST


def builds_beside_others(name: str) -> bool:
    """Whether backend ``name``'s build may run beside another's (bestofn.backends.loading):
    it constructs nothing under torch's process-wide defaults. Every other build runs one at a
    time, because transformers' ``from_pretrained`` sets torch's default dtype for the whole
    process while it builds (``local_torch_dtype``) and patches ``torch.nn.init``: a module
    built in another thread meanwhile takes that dtype, and two such loads interleaved can
    leave it set. On the H200 that gave VoiceCLAP bfloat16 heads (a dtype error) and Parakeet
    an illegal memory access."""
    d = declared().get(name)
    return bool(d and d.parallel_build)


class UnknownBackend(ValueError):
    pass


def is_plugin(name: str) -> bool:
    """A backend named by import path (``package.module:Class``) rather than a short name."""
    return ":" in name


def check_name(role: str, name: str) -> None:
    """Raise UnknownBackend for a short name that is not registered (imports nothing)."""
    names = registered().get(role, {})
    if not is_plugin(name) and name not in names:
        known = ", ".join(sorted(names))
        raise UnknownBackend(
            f"unknown {role} backend {name!r}; known: {known}, or your own class as "
            "'package.module:Class'"
        )


def backend_class(role: str, name: str) -> type:
    check_name(role, name)
    target = name if is_plugin(name) else registered()[role][name]
    module_name, _, attr = target.partition(":")
    if is_plugin(name):
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise UnknownBackend(
                f"{role} backend {name!r}: cannot import {module_name}: {e}"
            ) from None
        if not attr or not hasattr(module, attr):
            raise UnknownBackend(f"{role} backend {name!r}: module {module_name} has no {attr!r}")
        cls = getattr(module, attr)
    else:
        cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, ROLE_BASE[role])):
        raise UnknownBackend(f"{role} backend {target} is not a {ROLE_BASE[role].__name__}")
    return cls


def build(role: str, name: str, options: dict | None = None, device: str = "cpu"):
    """Instantiate backend ``name`` for ``role`` with its config ``options``. A scorer's
    ``resampler`` (runtime) is the pipeline's, not the constructor's: set on the instance and
    added to its provenance (the resampled input can change its scores)."""
    options = dict(options or {})
    if role != "scorer":
        return backend_class(role, name)(device=device, **options)
    from bestofn.backends.base import resolve_resampler

    resampler = resolve_resampler(options.pop("resampler", None), device)
    scorer = backend_class(role, name)(device=device, **options)
    scorer.resampler = resampler
    own = scorer.provenance
    scorer.provenance = lambda: {**own(), "resampler": scorer.resampler}  # as it runs now
    return scorer
