"""A fake run that shows what a scale does to the pick: global norm() against per-emotion
norm(x, emotion), and ei_target against ei_spec. No model: the scores are drawn here.

Two emotions whose own Empathic-Insight head lives on different scales: "Anger" (a loud head,
values 2..10) and "Contentment" (a quiet head, 0.1..0.6), with two more terms on 0..1 scales
(blend, genuineness), as LAION's reward_emo weights them (1.5 x target + blend + genuineness).
Every take has a true amount of the asked acting (``acting``); its target head is
``acting x the emotion's scale + loudness``, and every other head also carries ``loudness``
(a loud take reads high on many heads at once). Printed per emotion: how often the pick is the
take with the most acting, and how many picks of untouched Contentment groups change when 40
louder Anger groups join the run. The ranking is the selection's own (scales.expand and the
pick rule). Figures: docs/notes/selection-scales.md. Run: python -m lab.probes.scales_fake_run
"""

from __future__ import annotations

import duckdb
import numpy as np

from bestofn.select.rewards import Context, Reward, rank_window, resolve_over, scored_sql

TAKES = 8
GROUPS = 40  # per emotion
SCALES = {"Anger": (2.0, 8.0), "Contentment": (0.2, 1.5)}  # (offset, span) of the own head
EMOTIONS = ("Anger", "Contentment")
HEADS = ["ei_anger", "ei_contentment"]

SCORES = {
    "global norm (LAION)": "1.5 * norm(ei_target) + norm(vc_blend) + norm(vc_genuineness)",
    "norm per emotion": "1.5 * norm(ei_target, emotion) + norm(vc_blend) + norm(vc_genuineness)",
    "z per emotion": "1.5 * z(ei_target, emotion) + z(vc_blend, emotion) "
    "+ z(vc_genuineness, emotion)",
    "ei_spec, z per emotion": "1.5 * z(ei_spec, emotion) + z(vc_blend, emotion) "
    "+ z(vc_genuineness, emotion)",
}


def takes(rng, emotion: str, groups: int, first: int, span_factor: float = 1.0) -> list[tuple]:
    offset, span = SCALES[emotion]
    rows = []
    for g in range(first, first + groups):
        for t in range(TAKES):
            acting = rng.random()
            loud = 0.6 * rng.random()  # in head units of the emotion's span
            heads = {h: span * (loud + 0.2 * rng.random()) for h in HEADS}
            own = f"ei_{emotion.lower()}"
            heads[own] = offset + span * span_factor * (acting + loud)
            rows.append(
                (f"{emotion}/g{g:03d}", emotion, t, heads[own], heads["ei_anger"],
                 heads["ei_contentment"], rng.random(), rng.random(), acting)
            )  # fmt: skip
    return rows


def picks(rows: list[tuple], score: str) -> dict[str, tuple[int, bool]]:
    """group -> (the picked take, whether it is the take with the most acting)."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE takes (group_id VARCHAR, emotion VARCHAR, take INTEGER, ei_target DOUBLE, "
        "ei_anger DOUBLE, ei_contentment DOUBLE, vc_blend DOUBLE, vc_genuineness DOUBLE, "
        "acting DOUBLE)"
    )
    con.executemany("INSERT INTO takes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    (reward,) = resolve_over(
        con, "takes", [Reward("r", "true", score)], Context(heads=tuple(HEADS))
    )
    got = con.execute(
        f"""SELECT group_id, take, acting = max(acting) OVER (PARTITION BY group_id)
            FROM ({scored_sql(reward.filter, reward.score)}) QUALIFY {rank_window()} = 1"""
    ).fetchall()
    return {g: (t, best) for g, t, best in got}


def main() -> None:
    rng = np.random.default_rng(7)
    base = takes(rng, "Anger", GROUPS, 0) + takes(rng, "Contentment", GROUPS, 0)
    louder = takes(rng, "Anger", GROUPS, GROUPS, span_factor=2.0)
    print(f"{GROUPS} groups x {TAKES} takes per emotion; then {GROUPS} louder Anger groups join")
    print(f"score | picks with the most acting (chance {1 / TAKES:.1%}): Anger, Contentment | "
          "Contentment picks changed")  # fmt: skip
    for name, score in SCORES.items():
        before = picks(base, score)
        after = picks(base + louder, score)
        share = {
            e: np.mean([best for g, (_, best) in before.items() if g.startswith(e)])
            for e in EMOTIONS
        }
        moved = sum(before[g][0] != after[g][0] for g in before if g.startswith("Contentment"))
        print(f"{name} | {share['Anger']:.0%}, {share['Contentment']:.0%} | {moved}/{GROUPS}")


if __name__ == "__main__":
    main()
