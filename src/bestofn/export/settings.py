"""What an export is asked to do: the config's ``export:`` section (defaults from the schema)
with the command line's options on top, checked before anything is read or written."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

WHICH = ("selected", "passing", "all")
MARKER = "bestofn_export.json"  # in every export: settings, counts, unit fingerprints
# Shares written as decimals (0.9 + 0.05 + 0.05) miss 1 by float rounding only.
SHARE_TOLERANCE = 1e-6


class ExportError(ValueError):
    """Bad export input or a take that cannot be exported; nothing was written."""


@dataclass(frozen=True)
class ExportSettings:
    format: str
    out: Path
    which: str = "selected"
    where: str | None = None
    split_by: str = "prompt"
    split_seed: int = 0
    fractions: dict = field(default_factory=lambda: {"train": 1.0})
    shard_size: int = 1000
    sample_rate: int | None = None
    channels: int | None = None
    paths: str = "relative"
    skip_broken: bool = False
    overwrite: bool = False
    card: dict = field(default_factory=dict)
    reward: str | None = None  # None: the default reward (selection.filter/score)
    top: int | None = None  # --which selected: the best k per group (None: the best one)
    margin: float | str = 0.0  # pairs: chosen's score minus rejected's, at least
    pairs_per_group: int | str = 1  # pairs: at most this many per group

    @classmethod
    def from_config(cls, export: dict, **overrides) -> ExportSettings:
        """``export``: the config's export section with the schema's defaults applied;
        ``overrides``: the command line's options (None: not given)."""
        split = export["split"]
        values = dict(
            format=export["format"],
            out=export["out"],
            which=export["which"],
            where=export["where"],
            split_by=split["by"],
            split_seed=split["seed"],
            fractions=dict(split["fractions"]),
            shard_size=export["shard_size"],
            sample_rate=export["sample_rate"],
            channels=export["channels"],
            paths=export["paths"],
            skip_broken=export["skip_broken"],
            card=dict(export["card"]),
            reward=export["reward"],
            top=export["top"],
            margin=export["pairs"]["margin"],
            pairs_per_group=export["pairs"]["per_group"],
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["out"] = Path(values["out"])
        return cls(**values)

    def check(self) -> None:
        """Every option on its own; the reward's name is checked against the config's rewards
        when the export opens the database (export_results), before anything is written."""
        from bestofn.export.formats import registry

        formats = registry()
        if self.format not in formats:
            raise ExportError(
                f"unknown export format {self.format!r}; one of: {', '.join(formats)}"
            )
        if self.which not in WHICH:
            raise ExportError(f"--which {self.which!r}: one of {', '.join(WHICH)}")
        if self.split_by not in ("prompt", "group"):
            raise ExportError(f"split by {self.split_by!r}: 'prompt' or 'group'")
        if not self.fractions:
            raise ExportError("no split given: NAME=SHARE,... e.g. train=0.9,test=0.1")
        for name, share in self.fractions.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) or share < 0:
                raise ExportError(
                    f"split {name}={share}: names are letters, digits and _, shares >= 0"
                )
        total = sum(self.fractions.values())
        if abs(total - 1.0) > SHARE_TOLERANCE:  # never renormalised: a typo would move takes
            shares = ",".join(f"{k}={v:g}" for k, v in self.fractions.items())
            raise ExportError(
                f"split shares {shares} sum to {total:g}, not 1: give shares that add up to 1 "
                "(e.g. train=0.9,validation=0.05,test=0.05; one name alone: train)"
            )
        if self.shard_size < 1:
            raise ExportError(f"--shard-size {self.shard_size}: at least 1")
        if self.channels not in (None, 1, 2):
            raise ExportError(f"--channels {self.channels}: 1 or 2")
        if self.sample_rate is not None and self.sample_rate < 1000:
            raise ExportError(f"--resample {self.sample_rate}: a rate in Hz (e.g. 24000)")
        if self.paths not in ("relative", "absolute"):
            raise ExportError(f"--paths {self.paths!r}: 'relative' or 'absolute'")
        if self.top is not None and (not isinstance(self.top, int) or self.top < 1):
            raise ExportError(f"--top {self.top!r}: a whole number, at least 1")
        if self.top is not None and self.which != "selected":
            raise ExportError(
                f"--top {self.top} with --which {self.which}: --top picks the best K of "
                "--which selected; passing and all export every such take already"
            )
        try:
            margin = float(self.margin)
        except (TypeError, ValueError):
            raise ExportError(f"--margin {self.margin!r}: not a number (e.g. 0.1)") from None
        if not math.isfinite(margin) or margin < 0:
            raise ExportError(f"--margin {self.margin!r}: a finite number, at least 0")
        try:
            per_group = int(self.pairs_per_group)
        except (TypeError, ValueError):
            per_group = 0
        if str(per_group) != str(self.pairs_per_group).strip() or per_group < 1:
            raise ExportError(
                f"--pairs-per-group {self.pairs_per_group!r}: a whole number, at least 1"
            )
        object.__setattr__(self, "margin", margin)
        object.__setattr__(self, "pairs_per_group", per_group)

    def check_out_dir(self, results: Path) -> None:
        """The out dir may not be in the results' groups, nor hold the results, nor replace a
        directory that is not an export, nor an export unless --overwrite."""
        out, res = self.out.resolve(), results.resolve()
        groups = res / "groups"
        if out == groups or groups in out.parents:
            raise ExportError(
                f"--out {self.out} is inside {results}/groups: give a directory outside"
            )
        if out == res or out in res.parents:
            raise ExportError(f"--out {self.out} holds the results {results}: give a new directory")
        if out.exists():
            if not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file()):
                raise ExportError(
                    f"--out {self.out} exists and is not a bestofn export (no {MARKER}): "
                    "refusing to replace it"
                )
            if not self.overwrite and any(out.iterdir()):
                raise ExportError(
                    f"--out {self.out} already holds an export: pass --overwrite to replace it "
                    "(unchanged shards are reused)"
                )

    def recorded(self) -> dict:
        """The settings as the export's bestofn_export.json and card record them."""
        d = asdict(self)
        d["out"] = str(self.out)
        d.pop("overwrite")
        # the options of named rewards and pairs, where used (an export without them records
        # what it always did)
        for key in ("reward", "top"):
            if d[key] is None:
                d.pop(key)
        if self.format != "pairs":
            d.pop("margin")
            d.pop("pairs_per_group")
        return d

    def audio_key(self) -> str:
        """What changes the bytes of an exported audio file."""
        return f"rate={self.sample_rate};channels={self.channels}"
