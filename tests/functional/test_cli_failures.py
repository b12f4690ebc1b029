"""Every subcommand, run as users run it, with no `local up` running: one line saying what to do, the exit code
`servestack --help` documents, never a traceback (unless --debug). Also: a stale state file, a project found
from a subfolder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from servestack.cli.main import COMMANDS
from servestack.failures import ExitCode
from servestack.local.hosting.processes import free_port
from tests.conftest import ARTIFACTS, REPO_ROOT

SERVESTACK = str(Path(sys.executable).parent / "servestack")
SAMPLE = ARTIFACTS / "digits" / "1" / "sample-request.json"


@dataclass(frozen=True)
class Case:
    argv: list[str]
    expected: ExitCode
    says: str  # a phrase of the one line
    env: dict[str, str] | None = None
    in_project: bool = True


def cases() -> dict[str, Case]:
    free = free_port()
    model = str(ARTIFACTS / "digits/1/model.onnx")
    unreachable = f"http://127.0.0.1:{free}/invocations"
    return {
        # a folder to write the project into is the only thing init can get wrong
        "init": Case(["init", "../serving.yaml"], ExitCode.USAGE, "is a file: name a folder for the project"),
        "local up": Case(["local", "up"], ExitCode.USAGE, "no serving.yaml", in_project=False),
        "local deploy": Case(
            ["local", "deploy", "digits-realtime", "--version", "2"], ExitCode.NOT_RUNNING, "not running"
        ),
        "local run-batch": Case(["local", "run-batch", "cancer-nightly"], ExitCode.NOT_RUNNING, "not running"),
        "local status": Case(["local", "status"], ExitCode.NOT_RUNNING, "not running"),
        "local logs": Case(["local", "logs", "nope"], ExitCode.NOT_FOUND, "nope: not a deployment of this project"),
        "local down": Case(["local", "down"], ExitCode.OK, "not running"),  # nothing to stop is no failure
        "local put-input": Case(
            ["local", "put-input", "cancer-nightly", str(SAMPLE)], ExitCode.NOT_RUNNING, "not running"
        ),
        "invoke": Case(["invoke", "digits-api", "--data", str(SAMPLE)], ExitCode.NOT_RUNNING, "not running"),
        "models push": Case(
            ["models", "push", model, "--name", "d"], ExitCode.USAGE, "no serving.yaml", in_project=False
        ),
        "models list": Case(["models", "list"], ExitCode.NOT_RUNNING, "no registry"),
        "models promote": Case(["models", "promote", "digits", "1"], ExitCode.NOT_RUNNING, "no registry"),
        "models rollback": Case(["models", "rollback", "digits"], ExitCode.NOT_RUNNING, "no registry"),
        "loadtest": Case(
            ["loadtest", unreachable, "--data", str(SAMPLE), "--duration", "0.3", "--concurrency", "1"],
            ExitCode.FAILED,
            "no 2xx",
        ),
        "monitor": Case(["monitor", "--capture", "capture", "--model", "digits"], ExitCode.NOT_RUNNING, "no registry"),
        "serve": Case(["serve"], ExitCode.USAGE, "SERVESTACK_PORT", env={"SAGEMAKER_BIND_TO_PORT": "not-a-port"}),
        "models optimize": Case(["models", "optimize", "digits"], ExitCode.NOT_RUNNING, "no registry"),
        "plan": Case(["plan", "--peak-qps", "-3"], ExitCode.USAGE, "peak"),
        "completion": Case(["completion", "tcsh"], ExitCode.USAGE, "invalid choice", in_project=False),
    }


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    return {**env, **extra}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder (the repo's serving.yaml and its bundled models) with a subfolder to run from."""
    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "serving.yaml", root / "serving.yaml")
    return root


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SERVESTACK, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_every_subcommand_has_a_case() -> None:
    assert set(cases()) == {" ".join(command.words) for command in COMMANDS}


@pytest.mark.parametrize("words", sorted(cases()))
def test_subcommand_without_local_up_fails_in_one_line_with_its_documented_code(
    words: str, project: Path, tmp_path: Path
) -> None:
    # GIVEN no `local up` running, and a folder inside a project (or outside any, where that is the point)
    case = cases()[words]
    where = project / "notebooks" if case.in_project else tmp_path / "elsewhere"
    where.mkdir(exist_ok=True)
    tmp = tmp_path / "out"
    tmp.mkdir()
    argv = [
        *case.argv,
        *(["--report", str(tmp / "r.json"), "--plot", str(tmp / "r.png")] if words == "loadtest" else []),
    ]

    # WHEN the subcommand runs
    done = run(argv, where, clean_env(**(case.env or {})))

    # THEN it exits with the documented code, says what to do in one line, and shows no traceback
    assert done.returncode == case.expected, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"servestack {words}: ") or words == "loadtest", done.stderr
    assert case.says in done.stderr, done.stderr


def test_debug_shows_the_traceback_with_the_same_code(project: Path) -> None:
    done = run(["--debug", "invoke", "digits-api", "--data", str(SAMPLE)], project, clean_env())
    assert done.returncode == ExitCode.NOT_RUNNING
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("servestack invoke: ")


def test_a_missing_data_file_is_one_line_naming_it(project: Path) -> None:
    done = run(["invoke", "digits-api", "--data", "missing.json"], project / "notebooks", clean_env())
    assert done.returncode == ExitCode.USAGE
    assert (
        done.stderr.strip()
        == "servestack invoke: --data missing.json: no such file; give a request body (.json, .csv, .npy, or any file)"
    )


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


STALE: dict[str, Callable[[Path], dict[str, object]]] = {
    # local up was killed: its process is gone
    "exited": lambda _: {"pid": dead_pid(), "endpoint_url": "http://127.0.0.1:9", "deployments": {}},
    # the process lives (this test's), but nothing answers where the state says
    "silent": lambda _: {
        "pid": os.getpid(),
        "endpoint_url": f"http://127.0.0.1:{free_port()}",
        "registry": "s3://servestack-registry/models/",
        "deployments": {"digits-api": {"mode": "serverless", "url": f"http://127.0.0.1:{free_port()}"}},
    },
}


@pytest.mark.parametrize("kind", sorted(STALE))
@pytest.mark.parametrize("argv", [["invoke", "digits-api", "--data", str(SAMPLE)], ["models", "list"]])
def test_a_stale_state_file_says_local_up_is_not_running(kind: str, argv: list[str], project: Path) -> None:
    # GIVEN the project's state file left behind by a local up that is no longer there
    state = project / ".servestack" / "local.json"
    state.parent.mkdir()
    state.write_text(json.dumps(STALE[kind](project)))
    # WHEN a command that needs local up runs from a subfolder
    done = run(argv, project / "notebooks", clean_env(AWS_MAX_ATTEMPTS="1"))
    # THEN it exits 3 saying local up is not running, without a traceback
    assert done.returncode == ExitCode.NOT_RUNNING, done.stderr
    assert "Traceback" not in done.stderr
    assert "local up" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_invoke_outside_a_project_says_there_is_no_serving_yaml(tmp_path: Path) -> None:
    # GIVEN a folder in no project (no serving.yaml in it or above it)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # WHEN the user invokes a deployment there
    done = run(["invoke", "digits-api", "--data", str(SAMPLE)], elsewhere, clean_env())
    # THEN one line says there is no project here and how to fix it, not that local up is not running
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.strip() == (
        f"servestack invoke: no serving.yaml in {elsewhere.resolve()} or any folder above it: run this from your "
        "project, or pass --state (the state file of a running local up)"
    )


def test_a_command_whose_extra_is_missing_says_which_to_install(project: Path) -> None:
    # GIVEN a Python where moto (servestack[local]) cannot be imported, as after `pip install 'servestack[cli]'`
    blocked = "import sys; sys.modules['moto'] = None; from servestack.cli.main import main; sys.exit(main())"
    # WHEN `servestack local up` runs there, in a project
    done = subprocess.run(
        [sys.executable, "-c", blocked, "local", "up"],
        cwd=project,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # THEN it stops before doing anything, with one line naming the extra, and the documented code
    assert done.returncode == ExitCode.MISSING_EXTRA, done.stderr
    assert done.stderr == (
        "servestack local up: needs servestack[local] (missing: moto); install it: pip install 'servestack[local]'\n"
    )
    assert not (project / ".servestack").exists()
