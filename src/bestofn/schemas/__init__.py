"""The JSON schemas of the config and both sheets, shipped inside the package (so a plain
``pip install`` can validate), and the defaults they declare.

The schema is the one place a config default is written: ``apply_defaults`` fills them into a
config, ``runtime_defaults`` feeds ``bestofn.worker.client.runtime.Runtime`` and the ``bestofn
worker``
command line. Light on purpose (yaml only): ``bestofn`` imports it on every call."""

from __future__ import annotations

import copy
from functools import cache
from importlib.resources import files

import yaml

# libyaml's loader where PyYAML has it: the config schema loads about ten times faster (every
# report and database rule reads it for the database defaults; the same dict,
# tests/core/test_schemas.py)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def schema(name: str) -> dict:
    """The schema ``name`` (config, emotions, prompts); shared, so do not modify it."""
    return yaml.load((files(__package__) / f"{name}.schema.yaml").read_text("utf-8"), _LOADER)


def _fill(instance: dict, sch: dict) -> None:
    for key, sub in sch.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if isinstance(instance.get(key), dict) and "properties" in sub:
            _fill(instance[key], sub)
    extra = sch.get("additionalProperties")
    if isinstance(extra, dict) and "properties" in extra:  # a map of objects (selection.rewards)
        for key, value in instance.items():
            if key not in sch.get("properties", {}) and isinstance(value, dict):
                _fill(value, extra)


def apply_defaults(config: dict, name: str = "config") -> dict:
    """A deep copy of a (valid) ``config`` with every default its schema declares filled in."""
    out = copy.deepcopy(config)
    _fill(out, schema(name))
    return out


def runtime_defaults() -> dict:
    """``runtime`` field -> default, as the config schema declares them."""
    props = schema("config")["properties"]["runtime"]["properties"]
    return {key: sub["default"] for key, sub in props.items()}
