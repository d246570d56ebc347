"""Named rewards, the one ranking rule, and the tables selection keeps per reward.

A reward is a filter (the gate), a score and ``top``: the k best passing takes per group it
keeps. The config's ``selection.filter``/``score`` is the reward ``default`` (top 1: the
``selection`` table); ``selection.rewards`` adds more. The database keeps, next to the takes:

- ``rewards``: each reward as configured and as resolved (scales written out);
- ``reward_picks``: each reward's top-k takes per group, with their rank and score;
- ``reward_selection``: every picked take once (dedup across rewards), with the rewards it won;
- ``best_of_k``: per reward, emotion and k, the expected best score of k takes of a group.

All of it is SQL over the takes table, so ``bestofn select`` recomputes it without a GPU."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from bestofn.select import scales
from bestofn.select.base import SelectionError

DEFAULT = "default"
CLASSES = ("speech", "nonverbal")
# The pick rule, written once: the highest score wins, a NULL score never beats a number, ties go
# to the lowest take (deterministic across runs and machines).
PICK_ORDER = "score DESC NULLS LAST, take"


def rank_window(partition: str = "group_id") -> str:
    """A take's rank in its ``partition`` by the pick rule (1 = the pick)."""
    return f"row_number() OVER (PARTITION BY {partition} ORDER BY {PICK_ORDER})"


def scored_sql(filter_sql: str, score_sql: str, source: str = "takes") -> str:
    """Every row of ``source`` with its ``score`` and whether it ``passes`` (NULL fails)."""
    return (
        f"SELECT *, ({score_sql})::DOUBLE AS score, "
        f"coalesce(({filter_sql})::BOOLEAN, false) AS passes FROM {source}"
    )


@dataclass(frozen=True)
class Reward:
    name: str
    filter: str
    score: str
    top: int = 1


def rewards_of(selection: dict) -> list[Reward]:
    """The config's rewards: ``default`` (selection.filter/score, top 1), then
    ``selection.rewards`` in the config's order; a named reward without a filter uses the
    default's."""
    out = [Reward(DEFAULT, selection["filter"], selection["score"], 1)]
    for name, r in (selection.get("rewards") or {}).items():
        if name == DEFAULT:
            raise SelectionError(
                "selection.rewards.default: 'default' is selection.filter/score; name the "
                "reward otherwise"
            )
        out.append(Reward(name, r.get("filter") or selection["filter"], r["score"], r["top"]))
    return out


def reward_named(rewards: list[Reward], name: str, what: str = "--reward") -> Reward:
    for r in rewards:
        if r.name == name:
            return r
    names = ", ".join(r.name for r in rewards)
    raise SelectionError(f"{what} {name!r}: no such reward; the config's rewards: {names}")


# -- the emotions sheet's part in selection --------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What selection takes from the emotions sheet: each emotion's ``class`` (None: the sheet
    has no class column, and the takes get none: a run's tables stay as they were), and the
    Empathic-Insight head columns of its emotions (for ``ei_spec``)."""

    classes: dict | None = None
    heads: tuple = ()
    prefix: str = "ei_"

    def class_sql(self) -> str:
        whens = " ".join(
            f"WHEN '{e.replace(chr(39), chr(39) * 2)}' THEN '{c}'"
            for e, c in sorted((self.classes or {}).items())
        )
        return f"(CASE emotion {whens} ELSE 'speech' END)" if whens else "'speech'"

    def spec(self, columns) -> str | None:
        """``ei_spec``'s SQL over takes of ``columns`` (None when they lack the heads)."""
        have = {c.lower() for c in columns}
        heads = [h for h in self.heads if h.lower() in have]
        if f"{self.prefix}target" not in have or len(heads) < 2:
            return None
        return scales.spec_sql(heads, self.prefix)


def context_of(emotions_path: str | Path, models: dict | None = None) -> Context:
    """The Context of an emotions sheet (checked by the plan: ``bestofn check``); the head
    columns' prefix is that of the scorer that writes a column per emotion head."""
    from bestofn.backends.registry import backend_class

    text = Path(emotions_path).read_bytes().decode("utf-8-sig")
    rows = list(csv.DictReader(io.StringIO(text, newline=""), delimiter="\t"))
    prefix = "ei_"
    for entry in (models or {}).get("scorers", []):
        if backend_class("scorer", entry["backend"]).emotion_heads:
            prefix = (entry.get("options") or {}).get("column_prefix", "ei_")
    header = rows[0].keys() if rows else []
    classes = None
    if "class" in header:
        classes = {r["emotion"].strip(): (r["class"] or "").strip() or "speech" for r in rows}
    heads = []
    for r in rows:
        col = scales.head_column((r.get("ei_head") or "").strip() or r["emotion"].strip(), prefix)
        if col not in heads:
            heads.append(col)
    return Context(classes, tuple(heads), prefix)


# -- resolving a reward's SQL over a run -----------------------------------------------------


def scaled_measures(rewards: list[Reward]) -> list[str]:
    return scales.scaled_columns(
        *[(f"{r.name}.{what}", sql) for r in rewards for what, sql in (("filter", r.filter),
                                                                       ("score", r.score))]
    )  # fmt: skip


def resolved(rewards: list[Reward], ranges: scales.Ranges, spec: str | None) -> list[Reward]:
    """The rewards with their scales and ``ei_spec`` written out; a scaled column the takes lack
    is refused by name."""
    missing = [c for c in scaled_measures(rewards) if c.lower() not in ranges]
    if missing:
        raise SelectionError(
            f"selection: a scale names a column the takes do not have: {missing[0]!r}"
        )
    return [
        Reward(
            r.name,
            scales.expand(r.filter, ranges, spec, f"{r.name}.filter"),
            scales.expand(r.score, ranges, spec, f"{r.name}.score"),
            r.top,
        )
        for r in rewards
    ]


def resolve_over(con, source: str, rewards: list[Reward], context: Context) -> list[Reward]:
    """The rewards resolved over every take in ``source`` (a table on ``con``)."""
    cols = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()]
    spec = context.spec(cols)
    ranges = scales.collect(con, source, scaled_measures(rewards), spec)
    return resolved(rewards, ranges, spec)


# -- the per-reward tables -------------------------------------------------------------------


def picks_sql(r: Reward, source: str = "takes", top: int | None = None) -> str:
    """The reward's ``top`` best passing takes per group: reward, group_id, take, rank, score."""
    name = r.name.replace("'", "''")
    return f"""
        SELECT '{name}' AS reward, group_id, take, rank::INTEGER AS rank, score FROM (
            SELECT group_id, take, score, {rank_window()} AS rank
            FROM ({scored_sql(r.filter, r.score, source)}) WHERE passes)
        WHERE rank <= {int(top if top is not None else r.top)}"""


def _lchoose(a: str, b: str) -> str:
    return f"(lgamma(({a}) + 1) - lgamma(({b}) + 1) - lgamma(({a}) - ({b}) + 1))"


def best_of_k_sql(r: Reward, source: str = "takes") -> str:
    """The expected best score of k takes drawn without replacement from a group, for every k
    from 1 to the group's takes, averaged over each emotion's groups; exact, from order
    statistics.

    A draw is of k from all the group's n takes (what buying n takes means); only passing
    takes with a finite score can win (m of them). With the winners in ascending order, the
    i-th is the draw's best when it is drawn and none above it is: C(i-1 + n-m, k-1) / C(n, k).
    Per group and k: ``p_pass`` = the sum of those (a draw holds a winner), the expected best =
    sum(score x chance) / p_pass (the best of the draws that yield a take). Per emotion:
    ``expected_best`` averages the groups that have a winner; ``p_pass`` averages every group
    of at least k takes (a group with no winner counts 0)."""
    name = r.name.replace("'", "''")
    win = "passes AND isfinite(score)"
    return f"""
        WITH scored AS ({scored_sql(r.filter, r.score, source)}),
        g AS (SELECT group_id, any_value(emotion) AS emotion, count(*) AS n,
                     count(*) FILTER (WHERE {win}) AS m
              FROM scored GROUP BY group_id),
        w AS (SELECT group_id, score,
                     row_number() OVER (PARTITION BY group_id ORDER BY score, take) AS i
              FROM scored WHERE {win}),
        drawn AS (SELECT w.group_id, w.score, w.i, g.n, g.m, unnest(range(1, g.n + 1)) AS k
                  FROM w JOIN g USING (group_id)),
        chance AS (SELECT group_id, k, score,
                          CASE WHEN i - 1 + n - m >= k - 1
                               THEN exp({_lchoose("i - 1 + n - m", "k - 1")} - {_lchoose("n", "k")})
                               ELSE 0 END AS c
                   FROM drawn),
        per AS (SELECT group_id, k, sum(score * c) / sum(c) AS best, sum(c) AS p_pass
                FROM chance GROUP BY group_id, k),
        gk AS (SELECT group_id, emotion, unnest(range(1, n + 1)) AS k FROM g)
        SELECT '{name}' AS reward, gk.emotion, gk.k::INTEGER AS k, count(*) AS groups,
               avg(per.best) FILTER (WHERE per.p_pass > 0) AS expected_best,
               sum(coalesce(per.p_pass, 0)) / count(*) AS p_pass
        FROM gk LEFT JOIN per USING (group_id, k)
        GROUP BY gk.emotion, gk.k"""


def knee(curve: list[tuple[int, float]], share: float = 0.9) -> int | None:
    """The smallest k whose expected best reaches ``share`` of the curve's rise from its first
    k to its last (None for an empty curve; the first k for a flat one)."""
    pts = [(k, v) for k, v in sorted(curve) if v is not None]
    if not pts:
        return None
    first, last = pts[0][1], pts[-1][1]
    for k, v in pts:
        if v >= first + share * (last - first):
            return k
    return pts[-1][0]


_TABLES = {
    "rewards": "name VARCHAR, position INTEGER, top INTEGER, filter VARCHAR, score VARCHAR, "
    "resolved_filter VARCHAR, resolved_score VARCHAR",
    "reward_picks": "reward VARCHAR, group_id VARCHAR, take INTEGER, rank INTEGER, score DOUBLE",
    "best_of_k": "reward VARCHAR, emotion VARCHAR, k INTEGER, groups BIGINT, "
    "expected_best DOUBLE, p_pass DOUBLE",
}


def write_reward_tables(
    con, configured: list[Reward], resolved_rewards: list[Reward], only: str | None = None
) -> dict:
    """(Re)write the per-reward tables on ``con`` from its ``takes`` (every reward, or the one
    named ``only``: the others' rows stay). Returns {reward: picked takes}."""
    for table, cols in _TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols})")
    counts = {}
    for pos, (conf, res) in enumerate(zip(configured, resolved_rewards, strict=True)):
        if only is not None and conf.name != only:
            continue
        for table, key in (
            ("rewards", "name"),
            ("reward_picks", "reward"),
            ("best_of_k", "reward"),
        ):
            con.execute(f"DELETE FROM {table} WHERE {key} = ?", [conf.name])
        con.execute(
            "INSERT INTO rewards VALUES (?, ?, ?, ?, ?, ?, ?)",
            [conf.name, pos, conf.top, conf.filter, conf.score, res.filter, res.score],
        )
        try:
            con.execute(f"INSERT INTO reward_picks {picks_sql(res)}")
            con.execute(f"INSERT INTO best_of_k {best_of_k_sql(res)}")
        except Exception as e:  # duckdb.Error: the reward's SQL on the takes
            raise SelectionError(
                f"selection reward {conf.name!r} failed on the takes: {e}"
            ) from None
        counts[conf.name] = con.execute(
            "SELECT count(*) FROM reward_picks WHERE reward = ?", [conf.name]
        ).fetchone()[0]
    con.execute(
        """CREATE OR REPLACE TABLE reward_selection AS
           SELECT p.group_id, p.take, list(p.reward ORDER BY r.position) AS rewards,
                  list(p.rank ORDER BY r.position) AS ranks
           FROM reward_picks p JOIN rewards r ON r.name = p.reward
           GROUP BY p.group_id, p.take ORDER BY p.group_id, p.take"""
    )
    return counts
