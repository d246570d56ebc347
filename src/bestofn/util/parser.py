"""The argument parser of `bestofn` and of each of its subcommands: every option's help shows
its default."""

from __future__ import annotations

import argparse


def _has_default(value) -> bool:
    # identity, not equality: a default of 0 is a value to show, False and None are not
    return not (value is None or value is False or value == argparse.SUPPRESS)


class _DefaultsShown(argparse.HelpFormatter):
    """Every option's help ends with its default, when it has one that the help does not state
    already (a default of None or False is no value: the help says what happens then)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            _has_default(default)
            and (action.option_strings or action.nargs in ("?", "*"))
            and "default" not in text.lower()
            and not isinstance(action, argparse._VersionAction | argparse._HelpAction)
        ):
            text = f"{text.strip()} (default: %(default)s)".lstrip()
        return text


class Parser(argparse.ArgumentParser):
    """``bestofn``'s parser: its subparsers (and theirs) are of this class too
    (``add_subparsers`` builds them with the parent's class), so each shows its defaults."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _DefaultsShown)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        # argparse prints no help line for an option without help text: one that has a default
        # gets the default as its help
        if kwargs.get("help") is None and _has_default(kwargs.get("default")):
            kwargs["help"] = "(default: %(default)s)"
        return super().add_argument(*args, **kwargs)


DEFAULT_CONFIG = "config/config.yaml"  # the workflow's own config, as the Snakefile reads it


def config_options(parser: argparse.ArgumentParser, base_help: str) -> None:
    """``--config`` (the workflow's config by default) and ``--base`` (where its relative paths
    start, ``base_help`` saying which), as every command that reads a config takes them."""
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--base", default=".", help=base_help)
