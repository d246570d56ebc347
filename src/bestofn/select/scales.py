"""Scales in the selection SQL: ``norm(x)``, ``norm(x, emotion)``, ``z(x)``, ``z(x, emotion)``
and the derived measure ``ei_spec``.

DuckDB has none of them, and the run's statistics are only known once every group is scored,
so each call is written out as plain SQL with the run's numbers (``expand``) before the SQL runs.
``x`` is a takes column or ``ei_spec``.

- ``norm(x)``: min-max over every take of the run. LAION's voice-acting recipe ranks by
  norm(target emotion), norm(blend), norm(genuineness), normalised "globally over the whole run"
  (LAION-AI/moss-8b-voice-acting SYNTHETIC_DATA_RECIPE.md section 6).
- ``norm(x, emotion)``: min-max within each emotion over the run; ``z(x)`` and ``z(x, emotion)``:
  (x - mean) / population standard deviation, over the run or within each emotion. Ours: the
  Empathic-Insight heads each live on their own scale, so one global range lets a loud
  emotion's spread swamp a quiet one's (docs/notes/selection-scales.md has a fake run's figures).
- ``ei_spec``: the group's own head (``ei_target``) minus the mean of the other emotions' heads
  of the emotions sheet: how much the asked emotion stands out, not how loud the take is on every
  head at once. Ours, not LAION's.

NaN and infinite values are left out of the statistics and scale to NULL (a NULL score is never
preferred, where NaN would sort above every number); a constant measure scales to 0."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bestofn.select.base import SelectionError

_CALL = re.compile(r"\b(norm|z)\s*\(", re.IGNORECASE)
_ARGS = re.compile(
    r'\s*("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_]*)\s*(?:,\s*([A-Za-z_][A-Za-z0-9_]*)\s*)?\)'
)
_STRING = re.compile(r"'(?:[^']|'')*'")
_SPEC = re.compile(r'(?<![."\w])ei_spec\b(?!\s*\()', re.IGNORECASE)
SPEC = "ei_spec"
PER = "emotion"  # the one column a scale may be taken within


@dataclass(frozen=True)
class Call:
    start: int
    end: int
    kind: str  # norm | z
    column: str  # as written, unquoted
    per_emotion: bool


def _masked(sql: str) -> str:
    """``sql`` with string literals blanked (same length): calls inside strings are not calls."""
    return _STRING.sub(lambda m: "'" + " " * (len(m[0]) - 2) + "'", sql)


_CLASS = re.compile(r'(?<![."\w])"?class\b"?(?!\s*\()', re.IGNORECASE)


def uses_class(sql: str) -> bool:
    """``sql`` reads the takes column ``class`` (the emotions sheet's), outside string literals."""
    return bool(_CLASS.search(_masked(sql)))


def calls(sql: str, name: str) -> list[Call]:
    """Every scale call in ``sql`` (not inside a string)."""
    masked = _masked(sql)
    out = []
    for m in _CALL.finditer(masked):
        arg = _ARGS.match(masked, m.end())
        kind = m[1].lower()
        if arg is None or (arg[2] is not None and arg[2].lower() != PER):
            raise SelectionError(
                f"selection.{name}: {kind}() takes one column name and optionally the word "
                f"emotion, e.g. {kind}(ei_target) or {kind}(ei_target, emotion); got "
                f"{sql[m.start() : m.start() + 40]!r}...\n{name}: {sql}"
            )
        col = arg[1]
        col = col[1:-1].replace('""', '"') if col[0] == '"' else col
        out.append(Call(m.start(), arg.end(), kind, col, arg[2] is not None))
    return out


def scale_calls(*named_sql: tuple[str, str]) -> dict[str, str]:
    """{measure (lower-cased): its first call as written, e.g. ``z(ei_target, emotion)``}."""
    seen: dict[str, str] = {}
    for name, sql in named_sql:
        for c in calls(sql, name):
            seen.setdefault(c.column.lower(), sql[c.start : c.end])
    return seen


def scaled_columns(*named_sql: tuple[str, str]) -> list[str]:
    """The measures the SQL scales (``(name, sql)`` pairs), in first-seen order."""
    seen: dict[str, str] = {}
    for name, sql in named_sql:
        for c in calls(sql, name):
            seen.setdefault(c.column.lower(), c.column)
    return list(seen.values())


def uses_spec(sql: str) -> bool:
    return bool(_SPEC.search(_masked(sql)))


def head_column(name: str, prefix: str = "ei_") -> str:
    """An Empathic-Insight head's column, folded as bestofn.backends.empathic.column_name folds
    it (that module imports torch; the selection rules do not need it)."""
    return prefix + re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def spec_sql(heads: list[str], prefix: str = "ei_") -> str:
    """``ei_spec`` as SQL over the takes: the target head minus the mean of the other heads
    (``heads``: the columns of every emotion head of the sheet, the group's own among them)."""
    if len(heads) < 2:
        raise SelectionError(
            f"selection: ei_spec needs the heads of at least two emotions of the sheet; the "
            f"takes have {heads or 'none'}"
        )
    target = f"{quote(prefix + 'target')}::DOUBLE"
    total = " + ".join(f"{quote(h)}::DOUBLE" for h in heads)
    return f"({target} - (({total}) - {target}) / {len(heads) - 1}.0)"


def with_spec(sql: str, spec: str | None) -> str:
    """``sql`` with every ``ei_spec`` written out as ``spec`` (None: refused by name)."""
    if not uses_spec(sql):
        return sql
    if spec is None:
        raise SelectionError(
            "selection: ei_spec needs Empathic-Insight's head columns (ei_target and the heads "
            "of the sheet's emotions), which the takes lack"
        )
    masked, out, at = _masked(sql), [], 0
    for m in _SPEC.finditer(masked):
        out += [sql[at : m.start()], spec]
        at = m.end()
    return "".join(out) + sql[at:]


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# -- statistics ------------------------------------------------------------------------------


@dataclass
class Stats:
    """Finite values of one measure: count, mean, sum of squared deviations, min, max."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    low: float | None = None
    high: float | None = None

    def merge(self, o: Stats) -> None:
        """Chan et al.'s pairwise update: chunks merge to the whole run's moments."""
        if not o.n:
            return
        n = self.n + o.n
        delta = o.mean - self.mean
        self.m2 += o.m2 + delta * delta * self.n * o.n / n
        self.mean += delta * o.n / n
        self.n = n
        self.low = o.low if self.low is None else min(self.low, o.low)
        self.high = o.high if self.high is None else max(self.high, o.high)

    @property
    def sd(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n else 0.0


# {measure (lower-cased): {None: the run's Stats, emotion: that emotion's Stats}}
Ranges = dict[str, dict[str | None, Stats]]


def measure_sql(column: str, spec: str | None) -> str:
    if column.lower() == SPEC:
        if spec is None:
            return with_spec(SPEC, None)
        return spec
    return f"{quote(column)}::DOUBLE"


def collect(con, source: str, columns: list[str], spec: str | None, params=None) -> Ranges:
    """The statistics of ``columns`` over ``source`` (a table, or ``read_parquet(?)`` with
    ``params``), for the run and per emotion; a column ``source`` lacks is left out."""
    have = {
        r[0].lower() for r in con.execute(f"DESCRIBE SELECT * FROM {source}", params).fetchall()
    }
    present = [c for c in columns if c.lower() in have or (c.lower() == SPEC and spec)]
    out: Ranges = {}
    for col in present:
        x = measure_sql(col, spec)
        fin = f"FILTER (WHERE isfinite({x}))"
        # per emotion where the takes have one (a bare table in a test may not)
        by = "emotion" if PER in have else "NULL::VARCHAR"
        rows = con.execute(
            f"""SELECT {by} AS e, grouping(e), count({x}) {fin}, avg({x}) {fin},
                       var_pop({x}) {fin}, min({x}) {fin}, max({x}) {fin}
                FROM {source} GROUP BY GROUPING SETS ((), (e))""",
            params,
        ).fetchall()
        per = out.setdefault(col.lower(), {})
        for emotion, whole, n, mean, var, low, high in rows:
            key = None if whole else emotion
            per[key] = Stats(n, mean or 0.0, (var or 0.0) * n, low, high) if n else Stats()
    return out


def merge(into: Ranges, more: Ranges) -> None:
    for col, per in more.items():
        mine = into.setdefault(col, {})
        for key, st in per.items():
            mine.setdefault(key, Stats()).merge(st)


def _literal(v: float) -> str:
    return f"'{v!r}'::DOUBLE"  # exact: the export recomputes the same scores from them


def _scaled(kind: str, x: str, st: Stats | None) -> str:
    if st is None or not st.n:
        return f"(CASE WHEN isfinite({x}) THEN 0.0 END)"
    if kind == "norm":
        if st.low is None or st.high is None or not st.high > st.low:
            return f"(CASE WHEN isfinite({x}) THEN 0.0 END)"
        return (
            f"(CASE WHEN isfinite({x}) THEN ({x} - {_literal(st.low)}) / "
            f"({_literal(st.high)} - {_literal(st.low)}) END)"
        )
    if not st.sd > 0:
        return f"(CASE WHEN isfinite({x}) THEN 0.0 END)"
    return f"(CASE WHEN isfinite({x}) THEN ({x} - {_literal(st.mean)}) / {_literal(st.sd)} END)"


def _call_sql(c: Call, ranges: Ranges, spec: str | None) -> str:
    x = measure_sql(c.column, spec)
    per = ranges[c.column.lower()]
    if not c.per_emotion:
        return _scaled(c.kind, x, per.get(None))
    whens = " ".join(
        f"WHEN '{e.replace(chr(39), chr(39) * 2)}' THEN {_scaled(c.kind, x, st)}"
        for e, st in sorted((e, st) for e, st in per.items() if e is not None)
    )
    return f"(CASE emotion {whens} END)" if whens else "(NULL::DOUBLE)"


def expand(sql: str, ranges: Ranges, spec: str | None, name: str = "score") -> str:
    """``sql`` with every scale call written out with ``ranges`` and ``ei_spec`` with ``spec``."""
    out, at = [], 0
    for c in calls(sql, name):
        out += [with_spec(sql[at : c.start], spec), _call_sql(c, ranges, spec)]
        at = c.end
    return "".join(out) + with_spec(sql[at:], spec)


def unit_ranges(columns: list[str], emotions=("e",)) -> Ranges:
    """Unit statistics (0..1, mean 0, sd 1) to bind SQL before any take is scored."""
    st = Stats(2, 0.0, 2.0, 0.0, 1.0)
    return {c.lower(): {None: st, **{e: st for e in emotions}} for c in columns}
