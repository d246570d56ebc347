"""The fake run of docs/notes/selection-scales.md: per-emotion scales find the quiet emotion's
best acting where the global range does not, and keep its picks when other groups join."""

from lab.probes import scales_fake_run as fake


def test_per_emotion_scales_rank_the_quiet_emotion_by_its_own_head(capsys):
    fake.main()
    out = capsys.readouterr().out
    rows = {
        line.split(" | ")[0]: line.split(" | ")[1:]
        for line in out.splitlines()
        if " | " in line and not line.startswith("score |")
    }
    quiet = {name: int(v[0].split(", ")[1].rstrip("%")) for name, v in rows.items()}
    moved = {name: int(v[1].split("/")[0]) for name, v in rows.items()}
    assert quiet["global norm (LAION)"] < 12.5 < quiet["norm per emotion"]
    assert quiet["ei_spec, z per emotion"] >= quiet["norm per emotion"]
    assert moved["z per emotion"] == moved["ei_spec, z per emotion"] == 0
    # the figures docs/notes/selection-scales.md gives
    assert quiet == {
        "global norm (LAION)": 10, "norm per emotion": 35, "z per emotion": 40,
        "ei_spec, z per emotion": 40,
    }  # fmt: skip
