"""The export formats' registry: one Writer subclass per format, found by registry(); the
schema's export.format enum names exactly those; an unknown or doubly declared format is refused
by name."""

from __future__ import annotations

import pytest

from bestofn import schemas
from bestofn.export.formats import Writer, registry
from bestofn.export.settings import ExportError, ExportSettings


def test_schema_enum_is_the_registry():
    enum = schemas.schema("config")["properties"]["export"]["properties"]["format"]["enum"]
    assert sorted(enum) == sorted(registry())


def test_each_format_is_a_writer_of_its_own_module():
    for name, cls in registry().items():
        assert issubclass(cls, Writer) and cls.name == name
        assert cls.__module__.startswith("bestofn.export.")
        assert cls.unit in ("shard", "take", "whole")
        # what the export calls for the unit it declares is the class's own, not the base's
        needed = {"shard": ("write_shard", "shard_path", "load_lines"),
                  "take": ("finish", "load_lines"), "whole": ("export",)}[cls.unit]  # fmt: skip
        for method in needed:
            assert getattr(cls, method) is not getattr(Writer, method), (name, method)


def test_a_second_writer_of_one_name_is_refused():
    before = registry()
    with pytest.raises(TypeError, match="'hf' declared twice"):

        class Another(Writer):  # noqa: F841
            name = "hf"
            unit = "shard"

    assert registry() == before


def test_a_bad_unit_is_refused():
    with pytest.raises(TypeError, match="unit 'row'"):

        class Rows(Writer):  # noqa: F841
            name = "rows"
            unit = "row"

    assert "rows" not in registry()


def test_an_unknown_format_is_refused_by_name(tmp_path):
    settings = ExportSettings(format="tfrecord", out=tmp_path / "out")
    with pytest.raises(ExportError) as e:
        settings.check()
    assert "unknown export format 'tfrecord'" in str(e.value)
    for name in registry():
        assert name in str(e.value)
