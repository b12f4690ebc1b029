"""A command whose extra is not installed says which one to install, in one line and exit code 7: before it runs
(servestack/extras.py), and when it raises `ModuleNotFoundError` all the same. The extras table is
pyproject.toml's, and what `--help`, `--version` and argument parsing load is the standard library alone
(tests/e2e/test_base_install.py runs every command in a base install)."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions

import pytest

from servestack import extras
from servestack.cli import main as cli
from servestack.cli.main import COMMANDS, Command
from servestack.failures import ExitCode, MissingExtra, failure_of
from tests.conftest import REPO_ROOT

LINE = "needs servestack[local] (missing: moto); install it: pip install 'servestack[local]'"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_extras() -> dict[str, set[str]]:
    """Each extra's distributions, the extras it includes expanded; requirements with a marker left out."""
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def expand(extra: str) -> set[str]:
        found: set[str] = set()
        for requirement in declared[extra]:
            if ";" in requirement:
                continue
            name = re.match(r"[A-Za-z0-9_.-]+", requirement)[0]  # type: ignore[index]
            included = re.fullmatch(r"servestack\[([a-z,]+)\]", requirement)
            if included:
                for other in included[1].split(","):
                    found |= expand(other)
            else:
                found.add(normalized(name))
        return found

    return {extra: expand(extra) for extra in declared}


def test_the_extras_table_is_pyprojects() -> None:
    # GIVEN pyproject.toml's extras, and the distributions this environment has for each module (a distribution
    # the dev environment lacks, onnxmltools, is taken to install the module of its own name)
    declared = pyproject_extras()
    installed = {module: {normalized(d) for d in dists} for module, dists in packages_distributions().items()}

    def providers(module: str) -> set[str]:
        return installed.get(module, {normalized(module)})

    # THEN servestack/extras.py names the same extras, and each one's modules are exactly its distributions'
    assert set(extras.EXTRAS) == set(declared)
    for extra, modules in extras.EXTRAS.items():
        assert len(set(modules)) == len(modules), f"{extra}: a module named twice"
        provided = {module: providers(module) & declared[extra] for module in modules}
        assert all(provided.values()), f"{extra}: no distribution of the extra installs {provided}"
        assert set().union(*provided.values()) == declared[extra], f"{extra}: modules differ from pyproject.toml"


def test_every_command_declares_a_known_extra_or_none() -> None:
    unknown = {" ".join(c.words): c.extra for c in COMMANDS if c.extra is not None and c.extra not in extras.EXTRAS}
    assert unknown == {}


def test_the_base_commands_need_no_extra_and_the_rest_theirs() -> None:
    declared = {" ".join(c.words): c.extra for c in COMMANDS}
    assert declared["init"] is None
    assert declared["completion"] is None
    assert declared["local up"] == "local"
    assert declared["serve"] == "server"
    assert declared["models push"] == "cli"


def test_require_names_the_first_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(extras.EXTRAS, "local", ("argparse", "servestack_no_such_module", "another_missing_one"))
    with pytest.raises(MissingExtra) as raised:
        cli.require("local")
    assert raised.value.code == ExitCode.MISSING_EXTRA
    assert raised.value.message == (
        "needs servestack[local] (missing: servestack_no_such_module); install it: pip install 'servestack[local]'"
    )
    cli.require(None)  # nothing to check
    monkeypatch.setitem(extras.EXTRAS, "local", ("argparse", "json"))
    cli.require("local")  # everything found


def test_extra_of_is_the_smallest_extra_holding_a_module() -> None:
    assert extras.extra_of("moto") == "local"
    assert extras.extra_of("boto3") == "aws"
    assert extras.extra_of("numpy") == "runtime"
    assert extras.extra_of("yaml") == "cdk"
    assert extras.extra_of("not_a_dependency") is None


def fake_main(monkeypatch: pytest.MonkeyPatch, error: BaseException, extra: str | None, *argv: str) -> int:
    """`servestack [argv] fake` with a command table of one command, whose run raises `error`."""

    def run(_args: argparse.Namespace) -> int:
        raise error

    command = Command(("fake",), "a command that fails", lambda _parser: None, run, extra=extra)
    monkeypatch.setattr(cli, "COMMANDS", (command,))
    monkeypatch.setattr(cli, "require", lambda _extra: None)  # its extra counts as installed: run runs
    return cli.main([*argv, "fake"])


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        ("local", LINE),
        # a module of another extra than the declared one (a wrong declaration): the declared extra is named
        ("cli", "needs servestack[cli] (missing: moto); install it: pip install 'servestack[cli]'"),
        # no extra declared: the smallest extra installing the module
        (None, LINE),
    ],
)
def test_a_missing_third_party_module_is_one_line_naming_the_extra(
    extra: str | None, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a command whose run raises ModuleNotFoundError for moto, as `import moto` does without the extra
    # WHEN it runs
    code = fake_main(monkeypatch, ModuleNotFoundError("No module named 'moto'", name="moto"), extra)
    # THEN one line names the extra to install, and the exit code is the documented one
    assert code == ExitCode.MISSING_EXTRA == 7
    assert capsys.readouterr().err == f"servestack fake: {line}\n"


def test_with_debug_the_traceback_comes_first_and_the_code_is_the_same(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = fake_main(monkeypatch, ModuleNotFoundError("No module named 'moto'", name="moto"), "local", "--debug")
    err = capsys.readouterr().err
    assert code == ExitCode.MISSING_EXTRA
    assert err.startswith("Traceback (most recent call last)")
    assert err.endswith(f"servestack fake: {LINE}\n")


def test_a_declared_extra_that_is_missing_stops_the_command_before_it_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a command declaring `local`, where a module of that extra is missing
    ran: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        ran.append(args)
        return 0

    command = Command(("fake",), "a command", lambda _parser: None, run, extra="local")
    monkeypatch.setattr(cli, "COMMANDS", (command,))
    monkeypatch.setitem(extras.EXTRAS, "local", ("moto_is_not_here",))
    # WHEN it runs THEN it says which extra to install, without running
    assert cli.main(["fake"]) == ExitCode.MISSING_EXTRA
    assert capsys.readouterr().err == (
        "servestack fake: needs servestack[local] (missing: moto_is_not_here); "
        "install it: pip install 'servestack[local]'\n"
    )
    assert ran == []


def test_servestacks_own_missing_module_or_one_no_extra_installs_is_a_bug() -> None:
    # A module of servestack itself missing is a broken installation, and a module no extra installs a dependency
    # missing from pyproject.toml: neither is an extra to install.
    assert failure_of(ModuleNotFoundError("x", name="servestack.nothing"), "local") is None
    assert failure_of(ModuleNotFoundError("x", name="not_a_dependency")) is None
    assert failure_of(ModuleNotFoundError("x")) is None  # no name
    # A submodule is named as Python names it; the extra comes from its top-level package.
    assert failure_of(ModuleNotFoundError("x", name="onnx.helper")) == (
        ExitCode.MISSING_EXTRA,
        "needs servestack[cli] (missing: onnx.helper); install it: pip install 'servestack[cli]'",
    )


def test_parsing_help_and_version_load_only_the_standard_library() -> None:
    # GIVEN a fresh interpreter WHEN it builds the parser, formats every command's help, reads the version, and
    # maps a failure of a base command (init's OSError) to its line
    code = """
import sys, argparse
from servestack.cli.main import build_parser, _version
from servestack.failures import failure_of
parser = build_parser()
def walk(p):
    p.format_help()
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for child in a.choices.values():
                walk(child)
walk(parser)
_version()
failure_of(PermissionError(13, "Permission denied", "x"))
print(sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names) - {"servestack", "__main__"}))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    # THEN no third-party module was imported (the editable install's finder aside)
    loaded = [m for m in ast.literal_eval(done.stdout) if not m.startswith("__editable__")]
    assert loaded == []
