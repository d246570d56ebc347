"""Config and sheets -> the list of groups. Every check that can fail runs here, before any
model loads: a bad row is named by file, line and field."""

from __future__ import annotations

import codecs
import csv
import difflib
import hashlib
import io
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

import jsonschema

from bestofn import schemas
from bestofn.backends.registry import (
    UnknownBackend,
    backend_class,
    check_name,
    is_plugin,
)
from bestofn.core import recipe_checks, voice_acting
from bestofn.core.config import ConfigError, check_config
from bestofn.util.spec import GroupSpec
from bestofn.weights import lock as weights_lock
from bestofn.weights import paths as weight_paths


class PlanError(ValueError):
    """A problem in the config or a sheet, with the place it was found."""


schema = schemas.schema  # the package's own schemas (bestofn/schemas/*.schema.yaml)


@dataclass(frozen=True)
class Plan:
    config: dict
    groups: dict[tuple[str, str], GroupSpec]  # (emotion, prompt_id) -> spec
    # what runs but runs slower than the config means it to (the workflow logs them)
    warnings: tuple[str, ...] = ()
    memo_dir: Path | None = None  # the sha256 memo of the weights' content identity

    def group_params(self, emotion: str, prompt_id: str) -> str:
        """The group's spec as a stable JSON string, the reference voice's path included: what
        a worker runs (``spec_from_params``). Built field by field: Snakemake calls this once
        per group job, and dataclasses.asdict is 4x slower."""
        spec = self.groups[(emotion, prompt_id)]
        return json.dumps({f: getattr(spec, f) for f in _SPEC_FIELDS}, sort_keys=True)

    def group_identity(self, emotion: str, prompt_id: str) -> str:
        """The group's identity (its Snakemake param): every GroupSpec field but the reference
        voice's path, which is there by its content digest only (in ``extra``): moving the
        voice, the sheets or the tree reruns nothing."""
        spec = self.groups[(emotion, prompt_id)]
        fields_ = {f: getattr(spec, f) for f in _SPEC_FIELDS}
        fields_["reference_audio"] = None
        return json.dumps(fields_, sort_keys=True)

    @property
    def models_params(self) -> str:
        """The models' identity as a Snakemake param: no runtime knobs, and every weights path
        by its content (bestofn.weights.identity), never its place."""
        from bestofn.core.pipeline import models_identity

        return json.dumps(models_identity(self.config["models"], self.memo_dir), sort_keys=True)


def _decode_sheet(path: Path, data: bytes) -> str:
    """A sheet's text as spreadsheets save it: UTF-8 with or without a byte-order mark (Excel's
    and Google Sheets' "UTF-8" exports write one), or UTF-16 with its BOM (Excel's "Unicode
    Text"). Anything else that is not UTF-8 (Latin-1, Windows-1252...) is refused by place."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as e:
            raise PlanError(
                f"{path}: starts with a UTF-16 byte-order mark but {e.reason}"
            ) from None
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = skip + e.start  # offset in the file
        line = data.count(b"\n", 0, at) + 1
        col = at - (data.rfind(b"\n", 0, at) + 1) + 1
        byte = data[at]
        seen = bytes([byte]).decode("cp1252", errors="replace")
        raise PlanError(
            f"{path} line {line}, byte {col} (file offset {at}): 0x{byte:02x} is not UTF-8 "
            f"(it would be {seen!r} in Latin-1/Windows-1252). Save the sheet as UTF-8 (Excel: "
            "'CSV UTF-8' or 'Unicode Text'; LibreOffice: character set 'Unicode (UTF-8)') and "
            "run again"
        ) from None


def read_sheet(path: Path, kind: str) -> list[dict]:
    """Read a TSV sheet; check its columns and each row against the sheet's schema.

    Line ends may be LF or CRLF (Excel on Windows): the csv module takes both, and a CR never
    ends up in a value."""
    if not path.is_file():
        raise PlanError(f"{path}: no such {kind} sheet")
    text = _decode_sheet(path, path.read_bytes())
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t")
    header = reader.fieldnames or []
    rows = list(reader)
    sch = schema(kind)
    missing = [c for c in sch["required"] if c not in header]
    if missing:
        raise PlanError(f"{path}: missing column(s) {missing}; found columns {header}")
    unknown = [c for c in header if c not in sch["properties"]]
    if unknown:
        raise PlanError(f"{path}: unknown column(s) {unknown}; allowed: {list(sch['properties'])}")
    validator = jsonschema.Draft202012Validator(sch)
    for i, row in enumerate(rows):
        if None in row or any(v is None for v in row.values()):
            raise PlanError(f"{path} line {i + 2}: wrong number of tab-separated fields")
        row = {k: v.strip() if k != "text" else v for k, v in row.items()}
        rows[i] = row
        for err in validator.iter_errors(row):
            field = ".".join(str(p) for p in err.absolute_path) or "row"
            value = row.get(field, "")
            why = "is empty or whitespace" if field == "text" else err.message
            raise PlanError(f"{path} line {i + 2}: field {field!r} ({value!r}) {why}")
    return rows


def _split_ids(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _check_reference(path_str: str, where: str, base: Path, checked: dict) -> str:
    """Check a reference voice once per file; ``checked[path_str]`` is its content digest."""
    if path_str in checked:
        return path_str
    path = str(Path(path_str) if Path(path_str).is_absolute() else base / path_str)
    if path not in checked:
        import soundfile as sf

        if not os.path.isfile(path):
            raise PlanError(f"{where}: reference_audio {path_str!r} does not exist")
        try:
            info = sf.info(path)
        except Exception as e:  # libsndfile says why (format, truncation, ...)
            raise PlanError(
                f"{where}: reference_audio {path_str!r} is not readable audio: {e}"
            ) from None
        if info.frames == 0:
            raise PlanError(f"{where}: reference_audio {path_str!r} has no audio frames")
        with open(path, "rb") as f:
            checked[path] = hashlib.file_digest(f, "blake2b").hexdigest()[:32]
    checked[path_str] = checked[path]
    return path_str


_is_weight_option = weight_paths.is_weight_option
_roles = weight_paths.model_entries


def check_options(role: str, where: str, entry: dict) -> None:
    """Refuse an option (or runtime knob) the backend does not take, with a close match.

    Imports the backend's module but loads nothing: the known keys come from the class."""
    name = entry["backend"]
    try:
        known = backend_class(role, name).known_options()
    except UnknownBackend as e:
        raise PlanError(f"config {where}: {e}") from None
    except TypeError as e:  # a constructor taking **options that does not say which
        raise PlanError(
            f"config {where}: backend {name!r} does not declare its options: {e}"
        ) from None
    except ImportError as e:
        raise PlanError(
            f"config {where}: backend {name!r} cannot be imported ({e}); is its extra installed "
            "(pip install 'bestofn[production]' or '[embedded]')?"
        ) from None
    options, runtime = entry.get("options") or {}, entry.get("runtime") or {}
    both = sorted(set(options) & set(runtime))
    if both:
        raise PlanError(f"config {where}: {both} set in both options and runtime; keep one")
    cls = backend_class(role, name)
    for section, keys in (("options", options), ("runtime", runtime)):
        for key in keys:
            if key in known:
                continue
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            listed = ", ".join(sorted(known)) or "(none)"
            raise PlanError(
                f"config {where}.{section}: {role} backend {name!r} has no option {key!r}; "
                f"{hint}{name}'s options: {listed}"
            )
    try:  # the values, as the backend checks them when it is built
        cls.check_options({**options, **runtime})
    except ValueError as e:
        raise PlanError(f"config {where}: {e}") from None


def check_models(models: dict, base: Path = Path(".")) -> None:
    """Unknown backend names, and every weights path that does not exist, all listed at once;
    then options that the backend does not know."""
    missing = []
    for role, _, entry in _roles(models):
        try:
            check_name(role, entry["backend"])
            if is_plugin(entry["backend"]):  # your own class: it must import now, not mid-run
                backend_class(role, entry["backend"])
        except UnknownBackend as e:
            raise PlanError(f"config models: {e}") from None
        for key, value in (entry.get("options") or {}).items():
            if _is_weight_option(key) and isinstance(value, str) and value:
                path = Path(value).expanduser()
                if not (path if path.is_absolute() else base / path).exists():
                    missing.append(f"  {role} {entry['backend']}: options.{key} = {value}")
    if missing:
        raise PlanError(
            "config models: these weights paths do not exist (nothing is downloaded; put the "
            "weights there or change the paths):\n" + "\n".join(missing)
        )
    for role, where, entry in _roles(models):
        check_options(role, where, entry)
    from bestofn.core.agreement import AgreementError, check_files

    try:  # codebooks and sample rates the weight files state (small JSON/YAML reads)
        check_files(models, base)
    except AgreementError as e:
        raise PlanError(f"config models: {e}") from None


def build_plan(config: dict, base: str | Path = ".") -> Plan:
    """Validate ``config`` (paths relative to ``base``) and expand emotions x prompts to groups."""
    base = Path(base)
    try:  # Plan.config: every default the schema declares
        config = check_config(config)
    except ConfigError as e:
        raise PlanError(str(e)) from None
    try:  # weights paths relative to weights_root (or base), made absolute for the workers
        root = weight_paths.weights_root(config, base)
    except weight_paths.WeightsRootError as e:
        raise PlanError(str(e)) from None
    config["models"] = weight_paths.resolve_models(config["models"], root, base)
    check_models(config["models"], base)
    problems = weights_lock.check_config(config, base)
    if problems:
        raise PlanError(
            "config models: the weights do not match their lock (bestofn weights lock writes "
            "it again once the files are right):\n" + "\n".join(f"  {p}" for p in problems)
        )

    emotions = read_sheet(base / config["emotions"], "emotions")
    prompts = read_sheet(base / config["prompts"], "prompts")
    epath, ppath = base / config["emotions"], base / config["prompts"]
    _unique(emotions, "emotion", epath)
    _unique(prompts, "prompt_id", ppath)
    emotion_ids = {r["emotion"] for r in emotions}
    prompt_ids = {r["prompt_id"] for r in prompts}

    max_words = config["max_words"]
    checked: dict = {}
    for i, row in enumerate(prompts):
        where = f"{ppath} line {i + 2} (prompt_id {row['prompt_id']!r})"
        n_words = len(row["text"].split())
        if n_words > max_words:
            raise PlanError(
                f"{where}: text has {n_words} words, more than max_words={max_words}; split it "
                "into several prompts or raise max_words (nothing is cut silently)"
            )
        for e in _split_ids(row.get("emotions", "")):
            if e not in emotion_ids:
                raise PlanError(f"{where}: field 'emotions' names {e!r}, not in {epath}")
        if row.get("reference_audio"):
            _check_reference(row["reference_audio"], where, base, checked)
    for i, row in enumerate(emotions):
        where = f"{epath} line {i + 2} (emotion {row['emotion']!r})"
        for p in _split_ids(row.get("prompts", "")):
            if p not in prompt_ids:
                raise PlanError(f"{where}: field 'prompts' names {p!r}, not in {ppath}")
        if row.get("reference_audio"):
            _check_reference(row["reference_audio"], where, base, checked)

    try:
        takes_instruction, instruction = voice_acting.generator_instruction(config["models"])
    except ValueError as e:
        raise PlanError(str(e)) from None
    groups: dict[tuple[str, str], GroupSpec] = {}
    for e in emotions:
        allowed = set(_split_ids(e.get("prompts", ""))) or prompt_ids
        for p in prompts:
            only = set(_split_ids(p.get("emotions", "")))
            if p["prompt_id"] not in allowed or (only and e["emotion"] not in only):
                continue
            ref = p.get("reference_audio") or e.get("reference_audio") or None
            # The voice's content is part of the group's identity: a changed reference file
            # reruns exactly the groups that use it (it is no Snakemake input).
            extra = {"reference_audio_blake2b": checked[ref]} if ref else {}
            # the Instruction text (prompt, else emotion, else option) and the EI head
            extra.update(voice_acting.group_extra(e, p, takes_instruction, instruction))
            groups[(e["emotion"], p["prompt_id"])] = GroupSpec(
                emotion=e["emotion"],
                prompt_id=p["prompt_id"],
                text=" ".join(p["text"].split()),
                n_takes=int(config["takes"]),
                base_seed=int(config["seed"]),
                reference_audio=ref,
                emotion_description=e["description"],
                negative_description=e.get("negative_description", ""),
                language=p.get("language") or "en",
                extra=extra,
            )
    if not groups:
        raise PlanError("no groups: every emotion/prompt combination is filtered out")
    errors, notes = voice_acting.check_scorers(config, groups, epath, base)
    errors = voice_acting.check_languages(config["models"], groups, ppath) + errors
    gate_errors, gate_notes = recipe_checks.speaker_gate(
        config.get("selection"), groups, config["models"]
    )
    errors += gate_errors
    notes += gate_notes + recipe_checks.restorer_notes(config["models"])
    if errors:
        raise PlanError(errors[0])
    if takes_instruction:
        notes += voice_acting.same_for_every_emotion(groups, epath)
        notes += voice_acting.missing_bursts(instruction, prompts, ppath)
    elif any(p.get("instruction") for p in prompts):
        notes.append(
            f"note: {ppath}: the 'instruction' column is unused: generator "
            f"{config['models']['generator']['backend']!r} takes no instruction"
        )
    memo_dir = weights_lock.memo_dir_for(config, base)
    return Plan(config, groups, tuple(slow_settings(config) + notes), memo_dir)


PAIRING_QUEUE_DEPTH = 4  # a pair generating while the pair before is restored (config/README)


def slow_settings(config: dict) -> list[str]:
    """Settings that run, but slower than they are meant to (``config`` with the schema's
    defaults applied): each a line for the log."""
    from bestofn.core.pipeline import backend_kwargs

    if backend_kwargs(config["models"]["generator"]).get("pair_groups") is not True:
        return []
    runtime = config["runtime"]
    if not runtime["worker"]:
        return [
            "config models.generator pair_groups needs the warm worker (runtime.worker: true); "
            "every group job loads its own models and runs alone in the pair shape"
        ]
    if runtime["queue_depth"] < PAIRING_QUEUE_DEPTH:
        return [
            f"config runtime.queue_depth is {runtime['queue_depth']}: models.generator "
            f"pair_groups finds partners only with {PAIRING_QUEUE_DEPTH} or more; with fewer, "
            "most groups run alone in the pair shape and pay for a pair (config/README.md, "
            "'Two groups per generate call')"
        ]
    return []


def _unique(rows: list[dict], key: str, path: Path) -> None:
    first: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row[key] in first:
            raise PlanError(
                f"{path} line {i + 2}: duplicate {key} {row[key]!r} "
                f"(first at line {first[row[key]]})"
            )
        first[row[key]] = i + 2


_SPEC_FIELDS = [f.name for f in fields(GroupSpec)]


def spec_from_params(params: str) -> GroupSpec:
    return GroupSpec(**json.loads(params))
