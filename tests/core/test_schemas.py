"""The shipped schemas load the same with libyaml's loader as with PyYAML's own."""

from importlib.resources import files

import pytest
import yaml

from bestofn.schemas import schema


@pytest.mark.parametrize("name", ["config", "emotions", "prompts"])
def test_schema_is_the_safe_load(name):
    text = (files("bestofn.schemas") / f"{name}.schema.yaml").read_text("utf-8")
    assert schema(name) == yaml.safe_load(text)
