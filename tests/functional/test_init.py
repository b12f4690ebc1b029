"""`servestack init` as a user runs it (the installed command, in a folder of their own): a template of their own
with `--location`, a CDK app of their own with `--existing-cdk-app`, and never a file overwritten. The example
project itself, written from the wheel, is checked file for file by tests/e2e/test_installed_wheel.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SERVESTACK = str(Path(sys.executable).parent / "servestack")


def init(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SERVESTACK, "init", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_a_template_of_ones_own_is_copied_as_it_is_and_never_over_a_file(tmp_path: Path) -> None:
    # GIVEN a team's template folder, and a target that already holds one of its files, changed
    template = tmp_path / "template"
    (template / "handlers").mkdir(parents=True)
    (template / "serving.yaml").write_text("models: []\ndeployments: {}\n")
    (template / "handlers" / "serverless.py").write_text("from servestack.adapters.serverless import handler\n")
    (template / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (template / "run.sh").chmod(0o755)
    (template / "handlers" / "__pycache__").mkdir()
    (template / "handlers" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    target = tmp_path / "project"
    target.mkdir()
    (target / "serving.yaml").write_text("# mine\n")
    # WHEN init copies it
    done = init(str(target), "--location", str(template), cwd=tmp_path)
    # THEN every file is there as it is (a script stays executable), caches are left out, and the existing
    # file is kept and listed
    assert done.returncode == 0, done.stderr
    assert (target / "handlers" / "serverless.py").read_text() == "from servestack.adapters.serverless import handler\n"
    assert (target / "run.sh").stat().st_mode & 0o111
    assert not (target / "handlers" / "__pycache__").exists()
    assert (target / "serving.yaml").read_text() == "# mine\n"
    assert "kept  serving.yaml (it exists; init never overwrites a file)" in done.stdout
    assert "wrote handlers/serverless.py" in done.stdout


def test_an_existing_cdk_app_gets_serving_yaml_alone_and_the_two_lines(tmp_path: Path) -> None:
    # GIVEN a CDK app's folder WHEN `init --existing-cdk-app` runs in it
    (tmp_path / "cdk.json").write_text('{"app": "python3 app.py"}')
    done = init("--existing-cdk-app", cwd=tmp_path)
    # THEN it wrote serving.yaml and nothing else, and printed the lines to add after `app = App()`
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdk.json", "serving.yaml"]
    assert "    from servestack.cdk import add_serving\n    add_serving(app)" in done.stdout


def test_what_init_cannot_do_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cases = [
        (["file"], "file is a file: name a folder for the project"),
        (["--location", str(tmp_path / "nowhere")], "not a folder (a template is a folder laid out as a project)"),
        (["--existing-cdk-app", "--location", str(tmp_path)], "--existing-cdk-app writes serving.yaml only"),
    ]
    for args, said in cases:
        done = init(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert said in done.stderr, done.stderr
