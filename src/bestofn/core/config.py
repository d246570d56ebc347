"""The config file, read one way by every command: parsed, checked against the schema
(``schemas/config.schema.yaml``), its defaults filled in. The plan's own checks (sheets,
models, weights) run on top of this in ``core.plan.build_plan``."""

from __future__ import annotations

from pathlib import Path

import jsonschema

from bestofn import schemas
from bestofn.util.user_input import UserInputError, load_yaml_file


class ConfigError(ValueError):
    """The config breaks its schema; the message names the field (``config field X: ...``)."""


def check_config(config: dict) -> dict:
    """``config`` (a parsed mapping) checked against the schema, with every default the schema
    declares filled in (a copy); ConfigError names the first field that is wrong."""
    validator = jsonschema.Draft202012Validator(schemas.schema("config"))
    errors = sorted(validator.iter_errors(config), key=str)
    if errors:
        e = errors[0]
        where = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        raise ConfigError(f"config field {where}: {e.message}")
    return schemas.apply_defaults(config)


def load_config(path: str | Path) -> dict:
    """The config file at ``path``, checked, with its defaults. A missing or malformed file,
    YAML that is not a mapping, or a field the schema refuses raises UserInputError naming the
    file (``bestofn.cli`` prints it as ``error: <file>: <what>``, exit status 2)."""
    config = load_yaml_file(path, "config")
    try:
        return check_config(config)
    except ConfigError as e:
        raise UserInputError(path, str(e)) from None
