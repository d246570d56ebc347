"""What a package's modules declare, read from their text without importing them.

A module declares something with one top-level assignment of a Python literal (dicts, tuples,
strings, numbers, None, True/False), written as ``NAME = <literal>`` at the start of a line.
The backend registry reads the backends' declarations this way so that naming one backend
never imports another's modules (they import torch, NeMo, transformers at their top), and
``bestofn fake-weights`` finds the fakes that write a checkpoint the same way. Reading the
files and evaluating the one statement costs about a millisecond for the whole package; parsing
every module would cost tens (the plan and every worker start read it)."""

from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path


class DeclarationError(ValueError):
    """A declaration that is not a literal (or not one statement of the expected form)."""


def statement(text: str, variable: str) -> str | None:
    """The source of ``variable = ...``'s value in module source ``text`` (None: no such
    top-level assignment). The statement runs from its first line through every line that is
    blank, indented, or closes a bracket at the start of the line (a formatter's layout)."""
    found = re.search(rf"^{re.escape(variable)} = ", text, re.M)
    if found is None:
        return None
    start = end = found.end()
    while (end := text.find("\n", end) + 1) and end < len(text):
        if text[end] not in " \t\n)]}":
            break  # the next top-level statement or comment
    else:
        end = len(text)
    return text[start:end]


def literal(text: str, variable: str, where: str = "the module"):
    """The value of the literal assigned to ``variable`` at the top level of ``text``; None when
    it assigns none. A value that is not a literal raises DeclarationError naming ``where``."""
    source = statement(text, variable)
    if source is None:
        return None
    try:
        return ast.literal_eval(source.strip())
    except (ValueError, SyntaxError) as e:
        raise DeclarationError(
            f"{where}: {variable} must be a Python literal (dicts, tuples, strings, numbers): {e}"
        ) from None


def module_files(package_dir: Path, package: str) -> list[tuple[str, Path]]:
    """(module name, source file) of every module and subpackage directly in a package, by
    name: a subpackage's declarations sit in its ``__init__.py``."""
    out = []
    for info in sorted(pkgutil.iter_modules([str(package_dir)]), key=lambda m: m.name):
        path = package_dir / info.name
        path = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
        if path.is_file():
            out.append((f"{package}.{info.name}", path))
    return out


def declarations(
    package_dir: Path, package: str, variables: tuple[str, ...]
) -> dict[str, list[tuple[str, object]]]:
    """Per variable, (module name, value) for each module of the package that declares it,
    reading each file once."""
    out: dict[str, list[tuple[str, object]]] = {v: [] for v in variables}
    for module, path in module_files(package_dir, package):
        text = path.read_text(encoding="utf-8")
        for variable in variables:
            if variable in text and (value := literal(text, variable, str(path))) is not None:
                out[variable].append((module, value))
    return out
