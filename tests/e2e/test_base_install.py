"""`pip install servestack` with no extra, then every command: a command that needs an extra says which one in
one line (exit code 7), never a traceback; the commands of the base install (`init`, `completion`) work; and
`--help`, `--version` and every command's `--help` answer.

The wheel is built from this checkout and installed, with no extra, into a fresh virtual environment outside
the repository (tests/wheel.py). The commands are read from servestack.cli.main's table, so a new command is
covered here as soon as it has a row there (and minimal arguments below).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from servestack.cli.main import COMMANDS, Command
from servestack.failures import ExitCode
from tests.wheel import build_wheel, environment, install

pytestmark = pytest.mark.slow

# Arguments that parse for each command (its words), so that what runs is the command itself; none need to
# name anything that exists, except what a base command uses (init writes a folder).
MINIMAL_ARGUMENTS: dict[str, list[str]] = {
    "init": ["new-project"],
    "local up": [],
    "local deploy": ["digits-realtime", "--version", "1"],
    "local status": [],
    "local logs": [],
    "local down": [],
    "local put-input": ["cancer-nightly", "input.jsonl"],
    "local run-batch": ["cancer-nightly"],
    "invoke": ["digits-api", "--data", "request.json"],
    "models push": ["model.onnx", "--name", "digits"],
    "models list": [],
    "models promote": ["digits", "1"],
    "models rollback": ["digits"],
    "models optimize": ["digits"],
    "plan": ["--peak-qps", "10", "--average-qps", "5"],
    "loadtest": ["http://127.0.0.1:9/invocations"],
    "monitor": ["--capture", "capture", "--model", "digits"],
    "serve": [],
    "completion": ["bash"],
}
COMMAND_WORDS = [" ".join(command.words) for command in COMMANDS]
GROUPS = sorted({command.words[0] for command in COMMANDS if len(command.words) > 1})


@dataclass(frozen=True)
class BaseInstall:
    bin_dir: Path
    env: dict[str, str]

    def run(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "servestack"), *argv],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> BaseInstall:
    """servestack's wheel installed with no extra into a fresh virtual environment outside the repository."""
    root = tmp_path_factory.mktemp("base-install")
    bin_dir = install(build_wheel(root / "dist"), root / "venv")
    home = root / "home"
    home.mkdir()
    return BaseInstall(bin_dir, environment(bin_dir, home))


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def command(words: str) -> Command:
    return next(c for c in COMMANDS if " ".join(c.words) == words)


def test_every_command_has_minimal_arguments() -> None:
    missing = sorted(set(COMMAND_WORDS) - set(MINIMAL_ARGUMENTS))
    stale = sorted(set(MINIMAL_ARGUMENTS) - set(COMMAND_WORDS))
    assert not missing, f"add minimal valid arguments for {missing} to MINIMAL_ARGUMENTS in {__file__}"
    assert not stale, f"{stale}: no longer commands; remove them from MINIMAL_ARGUMENTS in {__file__}"


def test_the_base_install_has_no_third_party_package(base: BaseInstall) -> None:
    # GIVEN the base install WHEN its Python lists what is installed THEN it is servestack alone
    done = subprocess.run(
        [
            str(base.bin_dir / "python"),
            "-c",
            "import importlib.metadata as m; print(sorted(d.name for d in m.distributions()))",
        ],
        env=base.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "['servestack']"


@pytest.mark.parametrize("words", COMMAND_WORDS)
def test_each_command_in_the_base_install_names_its_extra_in_one_line(
    words: str, base: BaseInstall, empty: Path
) -> None:
    assert words in MINIMAL_ARGUMENTS, f"add minimal valid arguments for `servestack {words}` to MINIMAL_ARGUMENTS"
    extra = command(words).extra
    # GIVEN the base install, an empty folder WHEN the command runs with arguments that parse
    done = base.run([*words.split(), *MINIMAL_ARGUMENTS[words]], empty)
    # THEN no traceback, ever
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    if extra is None:
        # a command of the base install works
        assert done.returncode == ExitCode.OK, done.stderr
        assert done.stderr == ""
        return
    # and a command needing an extra exits 7 with one line naming that extra and how to install it
    assert done.returncode == ExitCode.MISSING_EXTRA, done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert re.fullmatch(
        rf"servestack {words}: needs servestack\[{extra}\] \(missing: [a-z_]+\); "
        rf"install it: pip install 'servestack\[{extra}\]'\n",
        done.stderr,
    ), done.stderr
    assert done.stdout == ""


def test_init_writes_the_example_project_in_the_base_install(base: BaseInstall, empty: Path) -> None:
    done = base.run(["init", "new-project"], empty)
    assert done.returncode == ExitCode.OK, done.stderr
    project = empty / "new-project"
    for written in ("serving.yaml", "app.py", "requirements.txt", "models/artifacts/digits/1/model.onnx"):
        assert (project / written).is_file(), f"{written}: not written\n{done.stdout}"


def test_completion_prints_a_script_in_the_base_install(base: BaseInstall, empty: Path) -> None:
    done = base.run(["completion", "bash"], empty)
    assert done.returncode == ExitCode.OK, done.stderr
    assert "complete -F _servestack servestack" in done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        *([group, "--help"] for group in GROUPS),
        *([*w.split(), "--help"] for w in COMMAND_WORDS),
    ],
    ids=lambda argv: " ".join(argv),
)
def test_help_and_version_answer_in_the_base_install(argv: list[str], base: BaseInstall, empty: Path) -> None:
    done = base.run(argv, empty)
    assert done.returncode == ExitCode.OK, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("servestack " if argv == ["--version"] else "usage: servestack"), done.stdout
