"""Model weight paths under the config's ``weights_root``: which options name weights, where a
relative one points, and the root itself (which must exist when it is set)."""

from __future__ import annotations

import copy
from pathlib import Path


class WeightsRootError(ValueError):
    pass


def is_weight_option(key: str) -> bool:
    """Options naming weights that must already exist (caches are created, so not checked)."""
    return not key.startswith("cache") and (key.endswith(("_path", "_dir")) or key == "lora")


def model_entries(models: dict):
    """(role, config place, entry) of every backend the models section names."""
    out = [("generator", "models.generator", models["generator"])]
    if models.get("restorer"):
        out.append(("restorer", "models.restorer", models["restorer"]))
    out += [("scorer", f"models.scorers[{i}]", s) for i, s in enumerate(models.get("scorers", []))]
    return out


def weight_options(models: dict):
    """(role, place, entry, option, value) of every option that names weights."""
    for role, where, entry in model_entries(models):
        for key, value in (entry.get("options") or {}).items():
            if is_weight_option(key) and isinstance(value, str) and value:
                yield role, where, entry, key, value


def weights_root(config: dict, base: str | Path = ".") -> Path | None:
    """The config's ``weights_root`` (relative to ``base``), absolute; None when unset. One that
    does not exist raises, naming the field."""
    value = config.get("weights_root")
    if not value:
        return None
    root = Path(value).expanduser()
    root = root if root.is_absolute() else Path(base) / root
    if not root.is_dir():
        raise WeightsRootError(
            f"config field weights_root: {value!r} ({root.absolute()}) is not a directory; "
            "fetch the weights there (bestofn weights fetch --config CONFIG) or change the field"
        )
    return root.absolute()


def resolve(value: str, root: Path | None, base: str | Path = ".") -> Path:
    """A weights option's path: absolute as given, else under ``root`` (or ``base`` without)."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    return (root if root is not None else Path(base).absolute()) / path


def resolve_models(models: dict, root: Path | None, base: str | Path = ".") -> dict:
    """A copy of the models section with every weights path absolute (what workers load)."""
    out = copy.deepcopy(models)
    for _, _, entry, key, value in weight_options(out):
        entry["options"][key] = str(resolve(value, root, base))
    return out


def relative_weight_paths(config: dict) -> list[str]:
    """Each weights path of the config relative to its ``weights_root`` (absolute paths outside
    the root are left out)."""
    root = config.get("weights_root")
    root = Path(root).expanduser().absolute() if root else None
    out = []
    for *_, value in weight_options(config["models"]):
        path = Path(value).expanduser()
        if not path.is_absolute():
            out.append(path.as_posix())
        elif root is not None and path.is_relative_to(root):
            out.append(path.relative_to(root).as_posix())
    return out
