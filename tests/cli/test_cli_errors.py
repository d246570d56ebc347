"""Every `bestofn` subcommand that reads a user's file (config, sheet, lock, votes, thresholds)
answers a missing file, a malformed one and one of the wrong shape with
``error: <file>: <what>`` and exit status 2, never a traceback.

The subcommands are enumerated from the parser itself (bestofn.cli.build_parser), so a new one
fails here until it is given its files below or listed as exempt with the reason."""

import argparse
import hashlib
import shutil

import pytest
from helpers import HELD_OUT, make_project, trade_off_results

from bestofn.cli import build_parser, main
from bestofn.report.votes import results_id
from bestofn.select.database import build_database
from bestofn.weights.lock import LOCK_NAME

CASES = ("missing", "malformed", "shape")

# what each kind of file looks like in each case (None: the file is not there)
CONTENT = {
    "yaml": {"missing": None, "malformed": "takes: 3\nmodels: [\n", "shape": "- takes: 3\n"},
    "json": {"missing": None, "malformed": '{"format": 1, "files": {', "shape": "[1, 2]\n"},
    # malformed: a row with a field too many; shape: none of the required columns
    "tsv": {
        "missing": None,
        "malformed": "prompt_id\ttext\np1\tHello.\textra\n",
        "shape": "id\tline\np1\tHello.\n",
    },  # fmt: skip
}

EXEMPT = {
    "run-group": "started by a group job with the spec and models JSON the workflow wrote",
    "worker": "started by group jobs (options the workflow wrote), not by hand",
    "workers": "reads the workers' own state directory, no user file",
    "fake-weights": "writes random weights; reads no user file",
    "parity": "reads published code and checkpoint directories, not a config/sheet/lock/votes",
}
# cases that do not apply to a subcommand's file, with the reason
NOT_APPLICABLE = {
    ("verify", "malformed"): "a broken group is verify's finding (listed, exit 1), not bad input",
    ("verify", "shape"): "as malformed",
    ("weights lock", "malformed"): "its input is a directory: only missing applies",
    ("weights lock", "shape"): "as malformed",
}


def leaves(parser: argparse.ArgumentParser, prefix=()) -> list[str]:
    """Every runnable subcommand, as it is typed ('weights fetch')."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += leaves(sub, (*prefix, name)) or [" ".join((*prefix, name))]
    return out


def place(path, kind, case):
    text = CONTENT[kind][case]
    if text is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def project(tmp_path):
    return make_project(tmp_path / "project")


def config_role(cmd, base=False):
    def make(tmp_path, case, db):
        bad = place(tmp_path / "user" / "config.yaml", "yaml", case)
        return [
            *cmd.split(),
            "--config",
            str(bad),
            *(["--base", str(tmp_path)] if base else []),
        ], bad

    return make


def sheet_role(cmd):
    def make(tmp_path, case, db):
        root = project(tmp_path)
        sheet = root / "config/prompts.tsv"
        sheet.unlink()
        place(sheet, "tsv", case)
        return [cmd, "--config", str(root / "config/config.yaml"), "--base", str(root)], sheet

    return make


def ab_role(which):
    def make(tmp_path, case, db):
        root = project(tmp_path)
        good = str(root / "config/config.yaml")
        bad = place(tmp_path / "user" / f"{which}.yaml", "yaml", case)
        thresholds = tmp_path / "th.yaml"
        thresholds.write_text("wer: {max_increase: 0.1}\n")
        files = {"a": good, "b": good, "thresholds": str(thresholds), which: str(bad)}
        argv = ["ab", "--base", str(root)] + [x for k in ("a", "b", "thresholds")
                                              for x in (f"--{k}", files[k])]  # fmt: skip
        return argv, bad

    return make


def votes_role(tmp_path, case, db):
    bad = place(tmp_path / "user" / "votes.json", "json", case)
    return ["listen", "import", str(bad), "--results", str(db)], bad


def weights_lock_file_role(tmp_path, case, db):
    bad = place(tmp_path / "user" / LOCK_NAME, "json", case)
    return ["weights", "fetch", "--lock", str(bad), "--root", str(tmp_path / "w")], bad


def weights_root_role(tmp_path, case, db):
    return ["weights", "lock", "--root", str(tmp_path / "absent")], tmp_path / "absent"


def reward_votes_role(tmp_path, case, db):
    root = project(tmp_path)
    bad = place(tmp_path / "user" / "votes.json", "json", case)
    argv = ["reward", "fit", "--config", str(root / "config/config.yaml"), "--base", str(root)]
    return [*argv, "--votes", str(bad), "--results", str(db)], bad


def prompts_source_role(tmp_path, case, db):
    """A local clone of LAION's Voice-Acting-Pipeline: its DramaBox file is the user's file
    (missing: the folder itself is not there)."""
    clone = tmp_path / "user" / "Voice-Acting-Pipeline"
    bad = place(clone / "data" / "dramabox_en.json", "json", case)
    argv = ["prompts", "import", str(clone), "--out", str(tmp_path / "sheets")]
    return argv, clone if case == "missing" else bad


def results_role(tmp_path, case, db):
    return ["verify", str(tmp_path / "absent")], tmp_path / "absent"


ROLES = {
    "verify": [results_role],
    "check": [config_role("check"), sheet_role("check")],
    "plan": [config_role("plan"), sheet_role("plan")],
    "doctor": [config_role("doctor"), sheet_role("doctor")],
    "status": [config_role("status"), sheet_role("status")],
    "weights list": [config_role("weights list")],
    "weights fetch": [config_role("weights fetch"), weights_lock_file_role],
    "weights lock": [weights_root_role],
    "serve": [config_role("serve")],
    "ab": [ab_role("a"), ab_role("b"), ab_role("thresholds")],
    "listen import": [votes_role],
    "export": [config_role("export")],
    "select": [config_role("select"), sheet_role("select")],
    "reward fit": [config_role("reward fit"), reward_votes_role],
    "prompts import": [prompts_source_role],
}


def test_every_subcommand_is_covered_or_exempt():
    names = leaves(build_parser())
    assert set(ROLES) | set(EXEMPT) == set(names), (
        "a subcommand without a row: give it ROLES (its user files) or an EXEMPT reason"
    )
    assert not set(ROLES) & set(EXEMPT)


@pytest.fixture(scope="module")
def results_db(tmp_path_factory):
    """A results directory with its database and listening-page id (what votes are checked
    against)."""
    results = tmp_path_factory.mktemp("cli") / "results"
    files = trade_off_results(results)
    build_database(files, results / "bestofn.duckdb", "wer <= 0.1", "quality", HELD_OUT, seed=5)
    results_id(results, create=True)
    return results


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "cmd, role", [(c, i) for c, roles in ROLES.items() for i in range(len(roles))]
)
def test_a_bad_file_is_named_with_exit_2_and_no_traceback(
    cmd, role, case, tmp_path, results_db, capsys
):
    if (cmd, case) in NOT_APPLICABLE:
        pytest.skip(NOT_APPLICABLE[(cmd, case)])
    results = tmp_path / "results"
    shutil.copytree(results_db, results)
    before = digest(results / "bestofn.duckdb")
    argv, bad = ROLES[cmd][role](tmp_path, case, results)
    rc = main(argv)  # an uncaught exception fails the test: that is the traceback
    err = capsys.readouterr().err
    assert rc == 2, (argv, err)
    assert f"error: {bad}" in err, (argv, err)
    assert digest(results / "bestofn.duckdb") == before  # a refused file changes nothing


def test_version_and_defaults_in_every_help(capsys):
    from bestofn import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"bestofn {__version__}"

    def helps(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from helps(sub)

    for parser in helps(build_parser()):
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if not isinstance(action.default, str | int | float) or action.default is False:
                continue
            if action.dest in ("help", "version") or action.help == argparse.SUPPRESS:
                continue
            said = "default" in (action.help or "").lower()  # the help says it in words
            assert said or f"(default: {action.default})" in text, (parser.prog, action.dest)


def test_every_subcommand_is_registered_by_its_package():
    """bestofn.cli only routes: each subcommand (parity aside: it parses its own argv) runs a
    function of the package that registered it."""
    import bestofn.cli as cli

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name == "parity":
                    continue
                func = sub.get_default("func")
                if func is None:  # a group of subcommands: its leaves carry the function
                    sub = next(
                        s
                        for a in sub._actions
                        if isinstance(a, argparse._SubParsersAction)
                        for s in a.choices.values()
                    )
                    func = sub.get_default("func")
                assert func is not None and func.__module__ != cli.__name__, name
