"""Build a module without its random initialisation, when a strict load overwrites every weight.

Restoring a model (NeMo's ``restore_from``) first constructs it, and construction draws every
parameter from ``torch.nn.init`` (``nn.Linear.reset_parameters``: ``kaiming_uniform_``; LSTMs and
embeddings: ``uniform_`` / ``normal_``) on the CPU, then the checkpoint replaces them all. For
Parakeet's 0.6 B parameters that draw was a third of the build (58 -> 39 s on a 2-core VM, with
bit-identical weights after the load).

``random_init_skipped()`` makes those draws no-ops, for the calling thread only: the worker
builds its backends in threads at once, and another backend's construction in another thread
still gets its random numbers. Deterministic fills (``zeros_``, ``ones_``, ``constant_``) still
run. Only safe around a load that fails on any weight it does not overwrite (``strict=True``):
a parameter the checkpoint lacks would otherwise keep whatever memory it was given.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                "xavier_uniform_", "xavier_normal_", "orthogonal_", "sparse_")  # fmt: skip

_local = threading.local()
_lock = threading.Lock()
_users = 0
_originals: dict[str, object] = {}


def _skippable(original):
    @functools.wraps(original)
    def init(tensor, *args, **kwargs):
        if getattr(_local, "depth", 0):
            return tensor
        return original(tensor, *args, **kwargs)

    return init


@contextlib.contextmanager
def random_init_skipped():
    """Within: ``torch.nn.init``'s random draws leave their tensor as it is, in this thread."""
    global _users
    with _lock:
        if _users == 0:
            for name in RANDOM_INITS:
                _originals[name] = getattr(torch.nn.init, name)
                setattr(torch.nn.init, name, _skippable(_originals[name]))
        _users += 1
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
        with _lock:
            _users -= 1
            if _users == 0:
                for name, original in _originals.items():
                    setattr(torch.nn.init, name, original)
                _originals.clear()
