"""The best-of-k curve in the report: for each reward, one line per emotion of the expected best
score of k takes (the database's ``best_of_k``, bestofn.select.rewards), its knee marked, and a
table of where each curve flattens: what the next run's ``takes`` (N) should be."""

from __future__ import annotations

from pathlib import Path

from bestofn.select.rewards import knee

PLOT = "best_of_k.png"
LEGEND_MAX = 12  # emotions named in a panel's legend at most (40 lines make a legend useless)


def curves(con) -> dict[str, dict[str, list[tuple[int, float, float]]]]:
    """{reward: {emotion: [(k, expected_best, p_pass)]}} (empty for a database without it)."""
    tables = {
        r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }
    if "best_of_k" not in tables:
        return {}
    out: dict[str, dict] = {}
    rows = con.execute(
        "SELECT b.reward, b.emotion, b.k, b.expected_best, b.p_pass FROM best_of_k b "
        "LEFT JOIN rewards r ON r.name = b.reward ORDER BY r.position, b.emotion, b.k"
    ).fetchall()
    for reward, emotion, k, best, p_pass in rows:
        out.setdefault(reward, {}).setdefault(emotion, []).append((k, best, p_pass))
    return out


def write_plot(data: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    n = max(1, len(data))
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 3.6), squeeze=False)
    for ax, (reward, per_emotion) in zip(axes[0], data.items(), strict=False):
        for emotion, pts in per_emotion.items():
            curve = [(k, b) for k, b, _ in pts if b is not None]
            if not curve:
                continue
            (line,) = ax.plot(*zip(*curve, strict=True), lw=1.2, label=emotion)
            at = knee(curve)
            ax.plot([at], [dict(curve)[at]], "o", color=line.get_color(), ms=5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k takes drawn from the group")
        ax.set_ylabel("expected best score")
        ax.set_title(f"reward {reward} (dots: knees)")
        if len(per_emotion) <= LEGEND_MAX:
            ax.legend(fontsize=7)
    if not data:
        axes[0][0].text(0.5, 0.5, "no best_of_k table: rebuild the database", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_lines(data: dict) -> list[str]:
    lines = [
        "## Best of k: how many takes to buy",
        "",
        "For each reward and emotion: the expected best score of k takes drawn from a group "
        "(exact, over the group's takes; a failing take never wins), averaged over the "
        "emotion's groups, and the knee: the smallest k that reaches 90 % of the rise from "
        'k = 1 to k = N. Past the knee, more takes buy little (README, "Choosing N").',
        "",
        f"![best of k]({PLOT})",
        "",
    ]
    if not data:
        return [*lines, "No `best_of_k` table in the database: run `bestofn select`.", ""]
    lines += [
        "| reward | emotion | N | best at k=1 | knee | best at knee | best at N | "
        "draws of 1 with a passing take |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for reward, per_emotion in data.items():
        for emotion, pts in per_emotion.items():
            curve = [(k, b) for k, b, _ in pts if b is not None]
            if not curve:
                lines.append(f"| {reward} | {emotion} | {pts[-1][0]} | – | – | – | – | 0 % |")
                continue
            at, values = knee(curve), dict(curve)
            lines.append(
                f"| {reward} | {emotion} | {pts[-1][0]} | {curve[0][1]:.4g} | {at} | "
                f"{values[at]:.4g} | {curve[-1][1]:.4g} | {100 * pts[0][2]:.0f} % |"
            )
    return [*lines, ""]


def write(con, out_dir: Path) -> list[str]:
    """The plot in ``out_dir`` and the report's lines."""
    data = curves(con)
    write_plot(data, Path(out_dir) / PLOT)
    return report_lines(data)
