"""A module's literal declaration, read from its text without importing it."""

import pytest

from bestofn.util.declared import DeclarationError, declarations, literal


def test_a_formatted_literal_is_read_to_its_end():
    text = 'import x\n\nX = {\n    "a": (\n        1,\n        2,\n    ),\n}\n# next\nY = 2\n'
    assert literal(text, "X") == {"a": (1, 2)}
    assert literal('X = {"a": "b" "c"}  # note\nZ = f()\n', "X") == {"a": "bc"}
    assert literal("X = 1", "X") == 1 and literal("Y = 1\n", "X") is None
    assert literal("def f():\n    X = 1\n", "X") is None  # only top-level assignments


def test_what_is_not_a_literal_is_refused_with_its_place():
    with pytest.raises(DeclarationError, match="here: X must be a Python literal"):
        literal("X = dict(a=1)\n", "X", "here")


def test_each_module_of_a_package_is_read(tmp_path):
    (tmp_path / "a.py").write_text('import torch\n\nX = {"a": 1}\n')
    (tmp_path / "b.py").write_text("Y = 2\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text('X = {"sub": 3}\n')
    found = declarations(tmp_path, "pkg", ("X", "Y"))
    assert found == {"X": [("pkg.a", {"a": 1}), ("pkg.sub", {"sub": 3})], "Y": [("pkg.b", 2)]}
