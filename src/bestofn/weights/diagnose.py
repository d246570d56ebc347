"""After a worker failed to load its models: which weight file is broken, where a file can say
so without loading it. A lock above the weights names any file that differs from it; without
one, each safetensors file's header is read (8-byte little-endian length, a JSON header whose
tensors' ``data_offsets`` end where the file must end: the published format,
huggingface/safetensors README "Format"), which names a truncated or cut shard that the
loader reports only as "incomplete metadata, file not fully covered"."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from bestofn.util import hashing
from bestofn.weights import lock, paths


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be whole, or None when its header and size agree."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path}: {size} bytes, shorter than a safetensors header"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"{path}: header of {n} bytes, but the file has {size}: cut short"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return f"{path}: its safetensors header is not JSON"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    want = 8 + n + max(ends, default=0)
    if size != want:
        return f"{path}: {size} bytes, its safetensors header says {want}: cut short or padded"
    return None


def broken_weights(models: dict) -> list[str]:
    """What can be told of the models' weight files without loading them (absolute paths)."""
    problems = []
    for *_, value in paths.weight_options(models):
        path = Path(value)
        if not path.exists():
            problems.append(f"{path}: missing")
            continue
        found = next((lock.lock_path(p) for p in path.parents if lock.lock_path(p).is_file()), None)
        if found is not None:
            rel = path.relative_to(found.parent).as_posix()
            try:
                problems += lock.verify(found.parent, [rel])
            except lock.LockError as e:
                problems.append(str(e))
        files = hashing.files_under(path) if path.is_dir() else [path]
        for f in files:
            if f.suffix == ".safetensors":
                problem = safetensors_problem(f)
                if problem:
                    problems.append(problem)
    return list(dict.fromkeys(problems))
