"""Every option of every command says what it does in ``--help``."""

from __future__ import annotations

import argparse

from stovepipe_fsm.apps.cli import build_parser


def parsers(parser: argparse.ArgumentParser, path: str = "stovepipe-fsm"):  # type: ignore[no-untyped-def]
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, f"{path} {name}")


def test_every_option_of_every_command_has_help() -> None:
    missing = [
        f"{path} {'/'.join(action.option_strings) or action.dest}"
        for path, parser in parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction)
        and not action.help
        and action.help != argparse.SUPPRESS
    ]
    assert missing == [], "options without help text:\n" + "\n".join(missing)
