"""Local mode's lifecycle as a user types it, from the project folder: `local up --detach`, `local status`,
`local logs NAME`, `local deploy` of a pushed version 2, a restart (`local down`, `local up --detach`) that keeps
version 2 live and says so, `local put-input` and `local run-batch --download`, then `local down`.

The commands of docs/try-it.md's block "In the background" are run as written there (the ports of `local up`
aside, free ones here). One local up at a time, with one realtime and one batch deployment, named as in the
docs; version 2 is pushed before the first start, so the restart reuses the templates (one synth in all)."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servestack.local.hosting.processes import free_port
from tests.conftest import ARTIFACTS, REPO_ROOT
from tests.e2e.conftest import copy_project

pytestmark = pytest.mark.slow
SERVESTACK = str(Path(sys.executable).parent / "servestack")
SPEC = {
    "models": [{"name": "digits", "version": 1}, {"name": "breast-cancer", "version": 1}],
    "deployments": {
        "digits-realtime": {"mode": "realtime", "model": "digits"},
        "cancer-nightly": {"mode": "batch", "model": "breast-cancer", "schedule": "rate(1 day)"},
    },
}
DOC_MARKER = "<!-- tested: tests/e2e/test_local_lifecycle.py"
FAST = ["--interval-sec", "1", "--bake-sec", "0", "--period-sec", "1", "--evaluation-periods", "1"]


def documented_commands() -> dict[str, list[str]]:
    """The docs block's commands (`servestack local WORD ...`), by WORD."""
    text = (REPO_ROOT / "docs/try-it.md").read_text(encoding="utf-8")
    block = re.search(re.escape(DOC_MARKER) + r".*?-->\n```bash\n(.*?)```", text, re.DOTALL)
    assert block is not None, "docs/try-it.md lost its block of local up's lifecycle commands"
    found = {}
    for line in block.group(1).splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[:2] == ["servestack", "local"], line
        found[argv[2]] = argv[1:]
    assert set(found) == {"up", "status", "logs", "put-input", "run-batch", "down"}, found
    return found


class User:
    """Commands typed in the project folder, with no servestack or AWS settings in the environment."""

    def __init__(self, project: Path) -> None:
        self.project = project
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
        self.env["PYTHONUNBUFFERED"] = "1"
        self.ports = [str(free_port()), str(free_port())]

    def cli(self, *argv: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [SERVESTACK, *argv], cwd=self.project, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert not check or done.returncode == 0, f"{argv}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def up_detached(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """`local up --detach` on this user's ports; other ports when another process took one meanwhile."""
        for _ in range(3):
            done = self.cli(*argv, "--port", self.ports[0], "--aws-port", self.ports[1], check=False, timeout=400)
            if done.returncode != 2 or "in use" not in done.stderr + done.stdout:
                break
            self.ports = [str(free_port()), str(free_port())]
        assert done.returncode == 0, done.stdout + done.stderr
        return done


def _digits_v2(path: Path) -> Path:
    """Digits with other bytes and the same behaviour: a healthy version 2."""
    import onnx

    model = onnx.load(str(ARTIFACTS / "digits" / "1" / "model.onnx"))
    model.doc_string = "digits, release 2"
    onnx.save(model, str(path))
    return path


def status_rows(user: User) -> dict[str, dict[str, object]]:
    rows = json.loads(user.cli("local", "status", "--json").stdout)["deployments"]
    return {row["deployment"]: row for row in rows}


def test_detach_status_logs_deploy_restart_batch_download_down(tmp_path: Path) -> None:
    typed = documented_commands()
    project = copy_project(tmp_path / "project", yaml.safe_dump(SPEC)).parent
    user = User(project)
    # GIVEN version 2 of digits pushed into the project (before local up: one synth serves both starts)
    user.cli("models", "push", str(_digits_v2(tmp_path / "digits-v2.onnx")), "--name", "digits")
    try:
        # WHEN local up starts detached
        started = user.up_detached(typed["up"])
        # THEN it returned once ready, with a status table; its progress came as plain lines (not a terminal)
        assert "digits-realtime" in started.stdout, started.stdout
        assert "running" in started.stdout
        log = (project / ".servestack" / "local-up.log").read_text()
        assert "synth: synthesizing: no earlier synth in cdk.out" in log
        assert "synth: templates written (" in log
        assert "children starting: 2/2 ready (" in log
        assert "synth: templates written (" in started.stderr  # relayed to the user while they waited
        assert "\x1b[" not in started.stderr + log  # no terminal codes off a terminal
        # AND status lists both deployments running, digits-realtime on version 1
        table = user.cli(*typed["status"]).stdout
        assert re.search(rf"digits-realtime +realtime +running +http://127.0.0.1:{user.ports[0]} +1 +0", table), table
        rows = status_rows(user)
        assert rows["cancer-nightly"]["mode"] == "batch"
        assert rows["cancer-nightly"]["state"] == "running"
        # AND the endpoint's log is its own file, shown by `local logs NAME`
        logs = user.cli(*typed["logs"]).stdout
        assert "[digits-realtime/endpoint] " in logs
        assert all(line.startswith("[digits-realtime/") for line in logs.splitlines()), logs[:2000]

        # WHEN version 2 is released with local deploy
        deployed = user.cli("local", "deploy", "digits-realtime", "--version", "2", "--traffic-rps", "10", *FAST)
        # THEN it goes live, and the output says how to pin it
        assert "digits-realtime: succeeded" in deployed.stdout
        assert "pin it in serving.yaml: deployments.digits-realtime.version: 2" in deployed.stderr
        assert status_rows(user)["digits-realtime"]["version"] == "2"

        # WHEN local up is restarted
        assert "stopped" in user.cli(*typed["down"]).stdout
        assert user.cli(*typed["status"], check=False).returncode == 3  # not running
        restarted = user.up_detached(typed["up"])
        # THEN version 2 is still live, and local up said why serving.yaml's 1 is not
        assert "digits-realtime: serving version 2 (from local deploy at " in restarted.stderr
        assert "serving.yaml pins 1)" in restarted.stderr
        assert "synth: reusing the templates: inputs unchanged" in restarted.stderr
        assert status_rows(user)["digits-realtime"]["version"] == "2"

        # WHEN a file of rows goes in with put-input, the batch runs, and its output is downloaded
        rows_in = json.loads((ARTIFACTS / "breast-cancer/1/sample-request.json").read_text())["instances"][:3]
        (project / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows_in) + "[1, 2]\n")
        put = user.cli(*typed["put-input"])
        assert put.stdout.strip().endswith("/input/rows.jsonl")
        ran = user.cli(*typed["run-batch"])
        # THEN stdout is as before (the manifest URL, then its summary), and the CSV holds every row in input order
        manifest_url, summary = ran.stdout.strip().splitlines()[-2:]
        assert manifest_url.endswith("/manifest.json")
        assert "rows" in json.loads(summary)
        with (project / "scores.csv").open() as handle:
            merged = [row for row in csv.DictReader(handle) if row["file"].endswith("/rows.jsonl")]
        assert [int(row["line"]) for row in merged] == [1, 2, 3, 4]
        assert all(row["label"] and not row["error"] for row in merged[:3])
        assert "InvalidInput" in merged[3]["error"]
        assert not merged[3]["prediction"]
    finally:
        stopped = user.cli(*typed["down"], check=False)
    assert stopped.returncode == 0, stopped.stderr
    assert not (project / ".servestack" / "local.json").exists()
    assert (project / ".servestack" / "releases.json").exists()  # kept for the next start
