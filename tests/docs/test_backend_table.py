"""config/README.md's backend table is the registry's: one row per registered backend, written
by ``python -m bestofn.backends.doc config/README.md`` from what each class declares."""

from helpers import REPO

from bestofn.backends.doc import main, render, table
from bestofn.backends.registry import registered

PAGE = REPO / "config/README.md"


def test_the_page_is_what_the_registry_writes():
    text = PAGE.read_text()
    assert render(text) == text, "run: python -m bestofn.backends.doc config/README.md"
    assert main([str(PAGE), "--check"]) == 0


def test_every_registered_backend_is_a_row():
    rows = table()
    for role, names in registered().items():
        for name in names:
            assert f"| {role} | `{name}` |" in rows


def test_a_stale_table_is_found(tmp_path):
    page = tmp_path / "README.md"
    page.write_text(PAGE.read_text().replace("| scorer | `duration` |", "| scorer | `length` |"))
    assert main([str(page), "--check"]) == 1
    assert main([str(page)]) == 0 and page.read_text() == PAGE.read_text()
