"""The command line's conventions: help on every argument (with defaults), `--version`, exit codes documented
in `--help` and in docs/cli.md, the extra each command needs listed there, and one failure line per expected
failure."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servestack.cli.main import COMMANDS, HelpFormatter, build_parser
from servestack.failures import ExitCode, failure_of
from tests.conftest import REPO_ROOT

SERVESTACK = str(Path(sys.executable).parent / "servestack")


def leaf_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, by its words ("models push")."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers:
            found[" ".join(words)] = parser
        for action in subparsers:
            for name, child in action.choices.items():
                walk(child, (*words, name))

    walk(build_parser(), ())
    return found


def test_every_subcommand_is_a_row_of_the_command_table() -> None:
    assert set(leaf_parsers()) == {" ".join(command.words) for command in COMMANDS}


@pytest.mark.parametrize("words", sorted(leaf_parsers()))
def test_every_argument_has_help_and_options_state_their_default(words: str) -> None:
    # GIVEN the parser of one subcommand, and the help text each argument gets
    parser = leaf_parsers()[words]
    formatter = HelpFormatter(parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = formatter._get_help_string(action)
        # THEN every argument carries help, and every option whose default is a value names it
        assert text.strip(), f"{words}: {action.dest} has no help"
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert "default" in text, f"{words} {action.option_strings[-1]}: help does not give its default"
    assert "%(default)s" not in parser.format_help()  # every placeholder was filled


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    done = subprocess.run([SERVESTACK, "--version"], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0
    assert done.stdout.strip() == f"servestack {version('servestack')}"


def test_exit_codes_are_listed_in_help_and_in_the_docs() -> None:
    # GIVEN the exit codes the CLI uses
    help_text = build_parser().format_help()
    reference = (REPO_ROOT / "docs/cli.md").read_text(encoding="utf-8")
    # THEN `servestack --help` and the command line reference list each one
    for code in ExitCode:
        assert re.search(rf"^\s+{int(code)}\s+\S", help_text, re.MULTILINE), f"exit code {int(code)} not in --help"
        assert re.search(rf"^\| `{int(code)}` \|", reference, re.MULTILINE), f"exit code {int(code)} not in docs/cli.md"


def test_expected_failures_map_to_their_codes_and_bugs_to_none() -> None:
    from servestack.failures import NotRunning
    from servestack.inference.errors import InvalidInput, ModelNotFound, VersionConflict
    from servestack.spec import SpecError

    assert failure_of(NotRunning("start it")) == (ExitCode.NOT_RUNNING, "start it")
    assert failure_of(ModelNotFound("no model 'x'", allowed="a, b")) == (
        ExitCode.NOT_FOUND,
        "no model 'x' (allowed: a, b)",
    )
    assert failure_of(VersionConflict("x@1 exists"))[0] == ExitCode.CONFLICT  # type: ignore[index]
    assert failure_of(InvalidInput("bad"))[0] == ExitCode.USAGE  # type: ignore[index]
    assert failure_of(SpecError("serving.yaml", ["models.0: x"]))[0] == ExitCode.USAGE  # type: ignore[index]
    assert failure_of(KeyError("a bug")) is None


def extras_table() -> str:
    """docs/cli.md's table of the extra each command needs, as `COMMANDS` declares them: one row per extra, in
    the order the table first names it."""
    by_extra: dict[str | None, list[str]] = {}
    for command in COMMANDS:
        by_extra.setdefault(command.extra, []).append(f"`{' '.join(command.words)}`")
    rows = [
        f"| {'none: `pip install servestack`' if extra is None else f'`servestack[{extra}]`'} | {', '.join(words)} |"
        for extra, words in by_extra.items()
    ]
    return "\n".join(["| extra | commands |", "| --- | --- |", *rows]) + "\n"


def test_the_docs_list_the_extra_each_command_needs() -> None:
    # GIVEN the extra each command declares, as a table
    table = extras_table()
    reference = (REPO_ROOT / "docs/cli.md").read_text(encoding="utf-8")
    # THEN docs/cli.md holds that table as it is (a new command, or a new extra, is a row to update)
    assert table in reference, f"docs/cli.md: replace the table of extras with\n{table}"
