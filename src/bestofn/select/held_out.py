"""What a selection's SQL names, and which held-out columns it must not: the filter and the
score as DuckDB parses them (every column they reach, the filter's top-level AND clauses), the
held-out entries of ``selection.held_out`` with their directions, and the check that refuses a
selection on a held-out column. The scorers declare per column which way is better
(``Scorer.better``); ``scorer_directions`` collects it from the config.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb

from bestofn.select.base import BASE_COLUMNS, SelectionError

# The composite is selected on: more is better by definition. Every other column's direction is
# declared by the scorer that writes it (Scorer.better, collected by ``scorer_directions``); a
# held-out column no scorer declares must say it: ``{column: my_col, better: higher}``.
COMPOSITE_BETTER = {"score": "higher"}
NUMERIC_TYPES = (
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
    "UBIGINT", "FLOAT", "DOUBLE", "REAL",
)  # fmt: skip
# The tables a whole-row reference could reach (``takes`` as a struct holds every column).
_TABLE_NAMES = {"takes", "scored"}


@dataclass(frozen=True)
class HeldOut:
    column: str
    better: str  # 'higher' | 'lower'


def is_numeric(sql_type: str) -> bool:
    t = sql_type.upper()
    return t.startswith(NUMERIC_TYPES) or t.startswith("DECIMAL")


# ---------------------------------------------------------------------------------------------
# SQL expressions, as DuckDB parses them


def _parse_expression(sql: str, name: str) -> dict:
    """DuckDB's parse tree of ``SELECT (sql)`` (the whole statement)."""
    if not sql.strip() or ";" in sql:
        raise SelectionError(f"selection.{name} must be one SQL expression, got {sql!r}")
    con = duckdb.connect()
    try:
        tree = json.loads(
            con.execute("SELECT json_serialize_sql(?)", [f"SELECT ({sql})"]).fetchone()[0]
        )
    finally:
        con.close()
    if tree.get("error"):
        raise SelectionError(
            f"selection.{name} is invalid SQL: {tree.get('error_message')}\n{name}: {sql}"
        )
    return tree


def referenced_columns(sql: str, name: str = "expression") -> set[str]:
    """Every column name the expression ``sql`` mentions, lower-cased (DuckDB identifiers are
    case-insensitive), from DuckDB's parse tree: string literals and lambda parameters are not
    columns. Every part of a qualified name counts (``t.col`` and ``col.field`` both name
    ``col``). ``*`` stands for a star or ``COLUMNS(...)`` expression, which can reach any
    column."""
    tree = _parse_expression(sql, name)
    found: set[str] = set()

    def walk(node, bound: frozenset[str]) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, bound)
            return
        if not isinstance(node, dict):
            return
        cls = node.get("class")
        if cls == "COLUMN_REF":
            names = [n.lower() for n in node.get("column_names", [])]
            if not (len(names) == 1 and names[0] in bound):
                found.update(names)
            return
        if cls == "STAR":
            found.add("*")
        if cls == "LAMBDA":
            params = set()
            lhs = node.get("lhs") or {}
            for ref in lhs.get("children", [lhs]):
                params.update(n.lower() for n in ref.get("column_names", []))
            walk(node.get("expr"), bound | params)
            return
        for value in node.values():
            walk(value, bound)

    walk(tree["statements"][0]["node"]["select_list"], frozenset())
    return found


def _unwrap(text: str) -> str:
    """``(a OR b)`` -> ``a OR b``; ``(a) OR (b)`` stays as it is."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth, quote = 0, None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and i < len(text) - 1:
                return text
    return text[1:-1]


def filter_clauses(filter_sql: str) -> list[str]:
    """The top-level AND clauses of the filter, in order, as DuckDB writes them back
    (``a AND (b AND c)`` is three clauses; an OR is one)."""
    tree = _parse_expression(filter_sql, "filter")
    node = tree["statements"][0]["node"]["select_list"][0]
    children = node["children"] if node.get("type") == "CONJUNCTION_AND" else [node]
    con = duckdb.connect()
    out = []
    try:
        for child in children:
            tree["statements"][0]["node"]["select_list"] = [child]
            text = con.execute(
                "SELECT json_deserialize_sql(?::JSON)", [json.dumps(tree)]
            ).fetchone()[0]
            out.append(_unwrap(text.removeprefix("SELECT ").strip()))
    finally:
        con.close()
    return out


# ---------------------------------------------------------------------------------------------
# Held-out columns


def scorer_directions(models: dict) -> dict[str, str]:
    """{column or glob pattern: 'higher' | 'lower'} that the configured scorers declare
    (``Scorer.better``); the workflow hands it to the database rule."""
    from bestofn.backends.registry import backend_class

    out: dict[str, str] = {}
    for entry in models.get("scorers", []):
        out.update(backend_class("scorer", entry["backend"]).better)
    return out


def declared_better(column: str, directions: dict[str, str] | None) -> str | None:
    """The direction of ``column``: the composite's, an exact declaration, or the first glob
    pattern (Empathic-Insight's quality heads) that matches; None where nobody says."""
    name = column.lower()
    if name in COMPOSITE_BETTER:
        return COMPOSITE_BETTER[name]
    table = {k.lower(): v for k, v in (directions or {}).items()}
    if name in table:
        return table[name]
    for pattern, better in table.items():
        if any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(name, pattern):
            return better
    return None


def held_out_columns(
    items: Iterable[str | dict] | None, directions: dict[str, str] | None = None
) -> list[HeldOut]:
    """``selection.held_out`` entries (a column name, or ``{column, better}``) -> HeldOut.
    A bare name takes its direction from the scorers' declarations (``directions``, see
    scorer_directions); an undeclared one is refused."""
    out: list[HeldOut] = []
    seen: set[str] = set()
    for i, item in enumerate(items or []):
        where = f"selection.held_out[{i}]"
        if isinstance(item, str):
            column, better = item, declared_better(item, directions)
            if better is None:
                raise SelectionError(
                    f"{where}: bestofn does not know whether more or less {item!r} is better; "
                    f"write {{column: {item}, better: higher}} (or lower)"
                )
        else:
            column, better = (
                item["column"],
                item.get("better") or declared_better(item["column"], directions),
            )
            if better not in ("higher", "lower"):
                raise SelectionError(f"{where}: better must be 'higher' or 'lower', got {better!r}")
        if column.lower() == "score":
            raise SelectionError(f"{where}: 'score' is the composite itself; it cannot be held out")
        if column.lower() in seen:
            raise SelectionError(f"{where}: {column!r} is held out twice")
        seen.add(column.lower())
        out.append(HeldOut(column, better))
    return out


def check_held_out(
    filter_sql: str,
    score_sql: str,
    held_out: Iterable[str | dict] | None,
    columns: dict[str, str] | None = None,
    directions: dict[str, str] | None = None,
) -> list[HeldOut]:
    """Refuse a filter or score that mentions a held-out column, and (when the takes columns are
    known) a held-out name that is not a numeric takes column. Returns the parsed entries."""
    if columns is not None:  # a misspelt name first: it is the likelier mistake
        known = {c.lower(): t for c, t in columns.items()}
        for item in held_out or []:
            name = item if isinstance(item, str) else item.get("column", "")
            if name.lower() not in known:
                raise SelectionError(
                    f"selection.held_out: {name!r} is not a takes column; the configured "
                    f"scorers write: {', '.join(sorted(set(columns) - set(BASE_COLUMNS)))}"
                )
            if not is_numeric(known[name.lower()]):
                raise SelectionError(
                    f"selection.held_out: {name!r} is {known[name.lower()]}, not a number: "
                    "only numeric columns can be compared"
                )
    entries = held_out_columns(held_out, directions)
    if not entries:
        return entries
    names = {h.column.lower(): h.column for h in entries}
    for name, sql in (("filter", filter_sql), ("score", score_sql)):
        refs = referenced_columns(sql, name)
        used = sorted(names[r] for r in refs if r in names)
        if used:
            raise SelectionError(
                f"selection.{name} uses held-out column(s) {', '.join(used)}: a held-out scorer "
                f"must never be selected on (drop it from selection.held_out, or from the "
                f"{name})\n{name}: {sql}"
            )
        whole = sorted(refs & (_TABLE_NAMES | {"*"}))
        if whole:
            raise SelectionError(
                f"selection.{name} uses {whole[0]!r}, which reaches every column, the held-out "
                f"ones ({', '.join(names.values())}) too: name the columns it needs\n{name}: {sql}"
            )
    return entries
