"""A benchmark project: a recipe config (config/recipes/*.yaml) run on a
`bestofn fake-weights` tree, with sheets of E emotions x P prompts and every take pinned to one
length. The GPU scripts (docs/bench/gpu_workflow.sh, worker_start_gpu.sh) and the lab probes
that start a worker build their project here, so that a config or layout change that breaks
them breaks their CPU smoke tests (tests/lab/test_gpu_scripts.py) too.

What is the recipe's and what is the fake tree's:

- the recipe's: which backends run (generator, restorer or none, the scorers), their options
  that are not weights paths, their runtime, the top-level runtime and the selection's score
  and held-out columns;
- the fake tree's (its config.yaml): weights_root, every weights path (an entry's options are
  the recipe's updated with the fake entry's of the same role and backend), the device, and
  the fake's runtime sizes where the tree is tiny (a CPU smoke run);
- this module's: the sheets (each emotion names an Empathic-Insight head of the tree in
  ``ei_head`` when the recipe scores with one: its ``ei_target`` needs a head), takes, the
  frame pin, and the selection filter ``n_frames > 0`` (random weights never pass a WER or
  speaker-similarity floor).

    python -m lab.project --recipe config/recipes/emotions.yaml --weights W --project DIR \
        [--emotions 2] [--prompts 8] [--takes 64] [--frames 188]

Environment knobs (as gpu_workflow.sh documents them): OVERLAP, CODEC_KERNELS, PAIR_GROUPS,
QUEUE_DEPTH, DECODE_BATCH, GEN_PRIORITY, WRITE_THREADS, CACHE_DIR, PARAKEET_ATTENTION,
PARAKEET_DECODING.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import yaml

WORDS = "the quick brown fox jumps over a lazy dog near our quiet river bank".split()
FILTER = "n_frames > 0"


class ProjectError(ValueError):
    """The recipe asks for a backend the fake tree has no weights for."""


def _merge_entry(recipe: dict, fake: dict | None, tiny: bool) -> dict:
    entry = copy.deepcopy(recipe)
    if fake is None or fake.get("backend") != entry.get("backend"):
        return entry
    entry["options"] = {**(entry.get("options") or {}), **(fake.get("options") or {})}
    if tiny and fake.get("runtime"):  # the CPU sizes of the tiny tree
        entry["runtime"] = {**(entry.get("runtime") or {}), **fake["runtime"]}
    return entry


def bench_config(recipe: dict, weights: Path, tiny: bool | None = None) -> dict:
    """``recipe`` on the fake weights under ``weights`` (sheets, takes and frames not set)."""
    fake = yaml.safe_load((weights / "config.yaml").read_text())
    tiny = fake.get("device") == "cpu" if tiny is None else tiny
    config = copy.deepcopy(recipe)
    config["weights_root"] = str(weights)
    config["device"] = fake["device"]
    config["results"] = "results"
    models, fake_models = config["models"], fake["models"]
    models["generator"] = _merge_entry(models["generator"], fake_models["generator"], tiny)
    if models.get("restorer"):
        models["restorer"] = _merge_entry(models["restorer"], fake_models.get("restorer"), tiny)
    fake_scorers = {s["backend"]: s for s in fake_models.get("scorers", [])}
    scorers = []
    for entry in models.get("scorers", []):
        if entry["backend"] not in fake_scorers and (entry.get("options") or {}):
            raise ProjectError(
                f"recipe scorer {entry['backend']!r} has options, and the fake weights "
                f"{weights} have no such scorer (theirs: {', '.join(sorted(fake_scorers))})"
            )
        scorers.append(_merge_entry(entry, fake_scorers.get(entry["backend"]), tiny))
    models["scorers"] = scorers
    if tiny:
        config["runtime"] = {**(config.get("runtime") or {}), **(fake.get("runtime") or {})}
    selection = {**config["selection"], "filter": FILTER}
    if selection.get("rewards"):  # a named reward's own filter gets the same
        selection["rewards"] = {
            name: {**r, "filter": FILTER} for name, r in selection["rewards"].items()
        }
    config["selection"] = selection
    return config


def heads_of(config: dict) -> list[str]:
    """The Empathic-Insight emotion heads of the config's scorer (none without one)."""
    from bestofn.backends.empathic import emotion_head_names

    for entry in config["models"].get("scorers", []):
        if entry["backend"] == "empathic-insight":
            heads = Path(entry["options"]["heads_path"])
            root = Path(config.get("weights_root") or ".")
            return emotion_head_names(heads if heads.is_absolute() else root / heads)
    return []


def write_project(
    recipe_path: Path,
    weights: Path,
    project: Path,
    n_emotions: int = 2,
    n_prompts: int = 8,
    takes: int = 64,
    frames: int = 188,
    env: dict | None = None,
) -> Path:
    """``project``/config.yaml and its sheets; returns the config's path."""
    env = os.environ if env is None else env
    weights, project = weights.resolve(), project.resolve()
    project.mkdir(parents=True, exist_ok=True)
    config = bench_config(yaml.safe_load(recipe_path.read_text()), weights)
    heads = heads_of(config)
    rows = []
    for i in range(n_emotions):
        head = f"\t{heads[i % len(heads)]}" if heads else ""
        rows.append(f"e{i}\tEmotion {i}.{head}\n")
    header = "emotion\tdescription" + ("\tei_head" if heads else "")
    (project / "emotions.tsv").write_text(f"{header}\n" + "".join(rows))
    (project / "prompts.tsv").write_text(
        "prompt_id\ttext\n"
        + "".join(f"p{i}\t{' '.join(WORDS[i % 7 :] + WORDS[: i % 7])}.\n" for i in range(n_prompts))
    )
    config.update(
        emotions=str(project / "emotions.tsv"), prompts=str(project / "prompts.tsv"), takes=takes
    )
    config["models"]["generator"].setdefault("options", {}).update(
        min_frames=frames, max_frames=frames
    )
    apply_knobs(config, env)
    path = project / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _scorers(config: dict, backend: str):
    return [s for s in config["models"].get("scorers", []) if s["backend"] == backend]


def apply_knobs(config: dict, env) -> None:
    """The environment's knobs (the module docstring) into ``config``, in place."""
    runtime = config.setdefault("runtime", {})
    if env.get("OVERLAP") == "host":  # the experimental mode lives under experimental:
        runtime.setdefault("experimental", {})["overlap"] = "host"
    elif env.get("OVERLAP"):  # runtime.overlap for this run (off, full; default auto)
        runtime["overlap"] = env["OVERLAP"]
    generator_runtime = config["models"]["generator"].setdefault("runtime", {})
    if env.get("CODEC_KERNELS"):  # the codec's eager or compiled pieces (default: auto)
        generator_runtime["codec_kernels"] = env["CODEC_KERNELS"]
    if env.get("PAIR_GROUPS") == "1":  # two groups per generate call
        generator_runtime["pair_groups"] = True
        runtime["queue_depth"] = 4
    elif env.get("PAIR_GROUPS") == "0":  # one group per call
        generator_runtime["pair_groups"] = False
    if env.get("QUEUE_DEPTH"):  # group jobs sent to the worker at once
        runtime["queue_depth"] = int(env["QUEUE_DEPTH"])
    if env.get("DECODE_BATCH"):  # takes per codec decode call
        generator_runtime["decode_batch_size"] = int(env["DECODE_BATCH"])
    if env.get("GEN_PRIORITY"):  # the generate phase's CUDA stream priority
        runtime.setdefault("experimental", {})["generate_priority"] = env["GEN_PRIORITY"]
    if env.get("WRITE_THREADS"):  # FLACs a group encodes at once (default: from the CPUs)
        runtime["write_threads"] = int(env["WRITE_THREADS"])
    if env.get("CACHE_DIR"):  # kept across runs (absolute)
        runtime["cache_dir"] = env["CACHE_DIR"]
    for key, var in (("attention", "PARAKEET_ATTENTION"), ("decoding", "PARAKEET_DECODING")):
        if env.get(var):
            for scorer in _scorers(config, "parakeet"):
                scorer.setdefault("runtime", {})[key] = env[var]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", type=Path, default=Path("config/recipes/emotions.yaml"))
    p.add_argument("--weights", type=Path, required=True, help="a bestofn fake-weights tree")
    p.add_argument("--project", type=Path, required=True)
    p.add_argument("--emotions", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--takes", type=int, default=64)
    p.add_argument("--frames", type=int, default=188)
    args = p.parse_args(argv)
    for path, what in ((args.recipe, "--recipe"), (args.weights / "config.yaml", "--weights")):
        if not path.is_file():
            print(f"error: {path}: no such file ({what})", file=sys.stderr)
            return 2
    try:
        out = write_project(args.recipe, args.weights, args.project, args.emotions,
                            args.prompts, args.takes, args.frames)  # fmt: skip
    except (ProjectError, KeyError, yaml.YAMLError) as e:
        print(f"error: {args.recipe}: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
