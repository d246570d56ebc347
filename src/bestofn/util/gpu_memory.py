"""A GPU memory cap for the warm worker (config ``runtime.gpu_memory_gb``).

The worker gets the config value in its options (``bestofn.worker.options.WorkerOptions``) and
applies it before it loads a model, with
``torch.cuda.set_per_process_memory_fraction`` on its device: PyTorch's caching allocator then
refuses (out of memory) any allocation past the cap, as a card with that much memory would.
The CUDA context itself (a few hundred MiB) is outside the allocator and comes on top.

GiB (2**30 bytes). A cap larger than the device is refused (an error naming the field and
both sizes); on a CPU-only worker the cap is ignored with a log line.
"""

from __future__ import annotations

import logging

log = logging.getLogger("bestofn.util.gpu_memory")

FIELD = "runtime.gpu_memory_gb"


def parse_cap(value) -> float | None:
    """A cap in GiB from the config: None/"" -> no cap; else > 0."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        gb = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{FIELD}: {value!r} is not a number of GiB") from None
    if not gb > 0 or gb != gb or gb == float("inf"):
        raise ValueError(f"{FIELD}: {value!r} must be a positive number of GiB")
    return gb


def apply_cap(value, device: str) -> dict | None:
    """Cap this process's PyTorch allocations on ``device`` to ``value`` GiB (None: no cap).

    Returns what was applied ({"gb", "device", "fraction", "total_gb"}), or None when there
    is no cap or it does not apply (a CPU device: logged). Raises ValueError when the cap is
    larger than the device."""
    gb = parse_cap(value)
    if gb is None:
        return None
    if not str(device).startswith("cuda"):
        log.info("%s = %g ignored: the worker runs on %s (no GPU to cap)", FIELD, gb, device)
        return None
    import torch

    if not torch.cuda.is_available():
        log.info("%s = %g ignored: no CUDA device is visible", FIELD, gb)
        return None
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    want = gb * 2**30
    if want > total:
        raise ValueError(
            f"{FIELD} = {gb:g} GiB is more than {device} has ({total / 2**30:.2f} GiB): "
            "lower it, or leave it out for no cap"
        )
    fraction = want / total
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    log.info("GPU memory capped to %g GiB on %s (%.4f of %.2f GiB; %s)",
             gb, device, fraction, total / 2**30, FIELD)  # fmt: skip
    return {"gb": gb, "device": str(device), "fraction": round(fraction, 6),
            "total_gb": round(total / 2**30, 3)}  # fmt: skip
