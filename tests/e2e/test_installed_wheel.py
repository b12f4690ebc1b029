"""servestack as a team adopts it: the wheel built from this checkout (`uv build`), installed with the extra the
docs name (`servestack[local]`) into a fresh virtual environment outside the repository, used from folders of
the team's own.

- The wheel installs `servestack` and nothing else at top level.
- `servestack init` writes the example project, file for file (apart from the files a new project gets of its
  own), and never overwrites a file.
- docs/start-a-project.md's commands, as written: `servestack init demo`, `servestack models push` of a bundled
  ONNX file, the lines it prints added to serving.yaml, `servestack local up --detach`, `servestack invoke` (IAM
  enforced), `local down`; then `npm ci` and `npx cdk synth`, which bundles every function from the installed
  wheel and passes cdk-nag, and whose templates pass cfn-lint. A function's bundle answers an HTTP API event,
  run from the bundle alone. The project's own smoke test (its `make test`) passes too.
- docs/existing-cdk-app.md's, in a team repository with packages named `models`, `handlers` and `stacks` of its
  own and a CDK app of its own, whose cdk.json sets none of servestack's feature flags: `servestack init
  --existing-cdk-app`, the two lines added to the app, one endpoint synthesized beside the team's own stack.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from servestack.template import INIT_FILES, SHARED
from tests.e2e.test_docs import Block, parse_blocks
from tests.wheel import REPO, build_wheel, environment, install, uv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
CDK = REPO / "node_modules" / ".bin" / "cdk"
EVENT = REPO / "tests" / "events" / "apiGatewayHttpApiV2Event.json"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    bin: Path
    env: dict[str, str]
    home: Path  # a folder outside the repository, where the team works

    def run(self, *argv: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def servestack(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "servestack"), *args, cwd=cwd)

    def shell(self, block: Block, cwd: Path, **replace: str) -> subprocess.CompletedProcess[str]:
        """A docs block run as written (but for the placeholders in `replace`) by `bash -e -o pipefail`, in a
        shell with the environment active, the CDK CLI on PATH and its notices off."""
        script = block.text
        for placeholder, value in replace.items():
            script = script.replace(placeholder, value)
        env = {**self.env, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "CDK_DISABLE_CLI_TELEMETRY": "true"}
        env["PATH"] = f"{env['PATH']}{os.pathsep}{CDK.parent}"  # after the environment's: a team's global CLI
        return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=900, check=False)  # fmt: skip


def doc_blocks_run_here(document: str) -> list[Block]:
    """The blocks of `document` that name this module as the test that runs them, in reading order."""
    blocks = parse_blocks((REPO / document).read_text(encoding="utf-8"), document)
    return [
        b for b in blocks if b.marker is not None and b.marker.kind == "tested" and Path(__file__).name in b.marker.text
    ]


def merged(spec_text: str, fragment: str) -> str:
    """serving.yaml with a fragment's models and deployments added, as a user pastes them under its keys."""
    spec, addition = yaml.safe_load(spec_text), yaml.safe_load(fragment)
    spec["models"] += addition["models"]
    spec["deployments"] |= addition["deployments"]
    return yaml.safe_dump(spec, sort_keys=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("installed")
    wheel = build_wheel(base / "dist")
    bin_dir = install(wheel, base / "venv", "local")
    home = base / "home"
    home.mkdir()
    return Installed(wheel, bin_dir, environment(bin_dir, home), home)


def bundled_onnx(installed: Installed) -> Path:
    """A bundled ONNX file, where the installed servestack keeps it."""
    code = "from servestack.template import bundled_artifacts; print(bundled_artifacts())"
    done = installed.run(str(installed.bin / "python"), "-c", code, cwd=installed.home)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip()) / "digits" / "1" / "model.onnx"


def test_the_wheel_installs_servestack_alone(installed: Installed) -> None:
    # GIVEN the wheel's RECORD (every file it installs) and its entry points
    import zipfile

    with zipfile.ZipFile(installed.wheel) as wheel:
        record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
        names = {line.split(",")[0].split("/")[0] for line in wheel.read(record).decode().splitlines() if line}
        entry_points = wheel.read(record.replace("RECORD", "entry_points.txt")).decode()
    # THEN its only top-level package is servestack, beside its metadata, and its one console script is `servestack`
    assert names == {"servestack", record.split("/")[0]}
    assert entry_points.split() == ["[console_scripts]", "servestack", "=", "servestack.cli.main:main"]


def test_init_writes_the_example_project_file_for_file_and_never_overwrites(installed: Installed) -> None:
    # GIVEN an empty folder WHEN `servestack init` writes a project there, from the installed wheel
    project = installed.home / "fresh"
    done = installed.servestack("init", str(project), cwd=installed.home)
    assert done.returncode == 0, done.stderr
    written = sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
    # THEN it holds this repository's example project (servestack.template.SHARED), file for file
    shared = sorted(
        str(p.relative_to(REPO))
        for item in SHARED
        for p in ([REPO / item] if (REPO / item).is_file() else (REPO / item).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    )
    own = sorted(
        (".gitignore" if p.name == "gitignore" else str(p.relative_to(INIT_FILES)))
        for p in INIT_FILES.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert written == sorted([*shared, *own, "requirements.txt"])
    mismatched = [name for name in shared if not filecmp.cmp(project / name, REPO / name, shallow=False)]
    assert mismatched == []
    # AND the files a new project gets of its own (docs/start-a-project.md names them), its dependency file
    # pinned to the installed servestack
    for name in own:
        source = INIT_FILES / ("gitignore" if name == ".gitignore" else name)
        assert (project / name).read_bytes() == source.read_bytes(), name
    assert "servestack[local]==0.1.0" in (project / "requirements.txt").read_text().splitlines()

    # WHEN it runs again over the same folder, after the user changed a file
    (project / "serving.yaml").write_text("# mine\n")
    again = installed.servestack("init", str(project), cwd=installed.home)
    # THEN it writes nothing: every file is kept, the user's change too
    assert again.returncode == 0, again.stderr
    assert "wrote" not in again.stdout
    assert again.stdout.count("kept") == len(written)
    assert (project / "serving.yaml").read_text() == "# mine\n"


START = "docs/start-a-project.md"
EXISTING = "docs/existing-cdk-app.md"


@dataclass(frozen=True)
class Demo:
    folder: Path
    local_up: subprocess.CompletedProcess[str]  # docs/start-a-project.md's local up, invoke and down
    synth: subprocess.CompletedProcess[str]  # its npm ci and cdk synth


@pytest.fixture(scope="module")
def demo(installed: Installed) -> Demo:
    """docs/start-a-project.md, block by block, as a user follows it."""
    init_and_push, lines, run_here, synth = doc_blocks_run_here(START)
    assert "servestack init demo" in init_and_push.text
    done = installed.shell(init_and_push, cwd=installed.home)
    assert done.returncode == 0, done.stdout + done.stderr
    project = installed.home / "demo"
    # the push's output says what to add to serving.yaml: the page's lines, which the user pastes
    assert "my-digits-api:" in lines.text
    assert "my-digits-api:" in done.stdout
    spec = project / "serving.yaml"
    spec.write_text(merged(spec.read_text(encoding="utf-8"), lines.text), encoding="utf-8")
    return Demo(project, installed.shell(run_here, cwd=project), installed.shell(synth, cwd=project))


def test_the_pages_project_runs_locally_with_iam_enforced_and_answers_the_pushed_model(demo: Demo) -> None:
    # GIVEN docs/start-a-project.md's `local up --detach`, `invoke my-digits-api`, `local down`
    done = demo.local_up
    # THEN each ran, and the pushed model answered its own sample request with the sample response's predictions
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    package = demo.folder / "models" / "artifacts" / "my-digits" / "1"
    answer = json.loads(next(line for line in done.stdout.splitlines() if line.startswith('{"model":"my-digits"')))
    expected = json.loads((package / "sample-response.json").read_text(encoding="utf-8"))
    assert answer["predictions"] == expected["predictions"]
    # AND local up ran the project's own app.py with IAM enforced from its templates
    log = (demo.folder / ".servestack" / "local-up.log").read_text(encoding="utf-8")
    assert "IAM: enforced from the templates" in log
    assert "servestack-my-digits-api" in log


def test_the_projects_own_smoke_test_passes(installed: Installed, demo: Demo) -> None:
    # GIVEN the project's own smoke test (tests/test_smoke.py, what its `make test` runs) and pytest, which its
    # requirements.txt names
    uv("pip", "install", "--quiet", "--python", str(installed.bin / "python"), "pytest")
    # WHEN it runs: `servestack local up --detach`, `servestack invoke` of each online deployment, `local down`
    done = installed.run(str(installed.bin / "python"), "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider",
                         cwd=demo.folder, timeout=900)  # fmt: skip
    # THEN every online deployment answered its sample: digits-realtime, digits-api and the pushed my-digits-api
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout


@pytest.fixture(scope="module")
def synthesized(demo: Demo) -> Path:
    assert demo.synth.returncode == 0, demo.synth.stdout[-3000:] + demo.synth.stderr[-3000:]
    return demo.folder / "cdk.out"


def cfn_lint(templates: list[str]) -> subprocess.CompletedProcess[str]:
    from tests.infra.test_checks import CFN_LINT_IGNORED
    from tests.infra.test_checks import cfn_lint as run_cfn_lint

    return run_cfn_lint(templates, list(CFN_LINT_IGNORED))


def test_cdk_synth_of_the_project_passes_cdk_nag_and_cfn_lint(synthesized: Path) -> None:
    # GIVEN `cdk synth` of demo/, which passed (the app runs cdk-nag's AwsSolutions checks: an unacknowledged
    # finding fails the synth and lists the plugin in the validation report)
    report = json.loads((synthesized / "validation-report.json").read_text(encoding="utf-8"))
    templates = sorted(str(p) for p in synthesized.glob("*.template.json"))
    # THEN every deployment has its stack, no validation plugin failed, the acknowledgements cdk-nag reads are
    # there, and cfn-lint finds nothing
    assert len(templates) == 5
    assert report["pluginReports"] == []
    assert "AwsSolutions-IAM5" in (synthesized / "servestack-my-digits-api.metadata.json").read_text()
    linted = cfn_lint(templates)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def function_bundle(out_dir: Path, stack: str) -> Path:
    """The bundle of the stack's servestack function, as cdk.out holds it (the template's S3Key, the assets)."""
    template = json.loads((out_dir / f"{stack}.template.json").read_text(encoding="utf-8"))
    (key,) = [
        r["Properties"]["Code"]["S3Key"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function" and r["Properties"]["Handler"] == "handlers.serverless.handler"
    ]
    assets = json.loads((out_dir / f"{stack}.assets.json").read_text(encoding="utf-8"))["files"]
    (path,) = [a["source"]["path"] for a in assets.values() if key in str(a["destinations"])]
    return out_dir / path


def answer_from_bundle(bundle: Path, sample: Path, model: str, home: Path) -> dict[str, object]:
    """The function's reply to an HTTP API event POSTing `sample`, run by a bare python3.12 from the bundle alone."""
    from servestack.cdk.bundling import find_python
    from tests.infra.test_bundling import RUN_HANDLER

    python = find_python("3.12")
    if python is None:
        pytest.skip("no python3.12 interpreter to run the bundle (pyenv install 3.12)")
    event = json.loads(EVENT.read_text(encoding="utf-8"))
    event["body"] = sample.read_text(encoding="utf-8")
    env = {"SERVESTACK_MODEL_DIR": str(bundle / "models" / "artifacts"), "SERVESTACK_DEFAULT_MODEL": model,
           "SERVESTACK_PROVIDERS": "auto", "PATH": "/usr/bin:/bin", "HOME": str(home)}  # fmt: skip
    done = subprocess.run([python, "-I", "-S", "-c", RUN_HANDLER, str(bundle), json.dumps(event)], cwd=home,
                          env=env, capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    reply: dict[str, object] = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("REPLY "))[6:])
    return reply


def test_the_pushed_models_function_bundle_answers_from_the_bundle_alone(
    installed: Installed, demo: Demo, synthesized: Path
) -> None:
    # GIVEN the bundle `cdk synth` built for my-digits-api from the installed wheel
    bundle = function_bundle(synthesized, "servestack-my-digits-api")
    # THEN it carries servestack's runtime at the installed version, the project's entry points and its package
    project = demo.folder
    assert (bundle / "handlers" / "serverless.py").read_bytes() == (project / "handlers" / "serverless.py").read_bytes()
    assert sorted(p.name for p in (bundle / "models" / "artifacts").iterdir()) == ["my-digits"]
    assert not (bundle / "servestack" / "cli").exists()
    # AND run as Lambda runs it, from the bundle alone, it answers the pushed model's sample
    package = project / "models" / "artifacts" / "my-digits" / "1"
    reply = answer_from_bundle(bundle, package / "sample-request.json", "my-digits", installed.home)
    assert reply["statusCode"] == 200, reply
    expected = json.loads((package / "sample-response.json").read_text(encoding="utf-8"))
    assert json.loads(str(reply["body"]))["predictions"] == expected["predictions"]


TEAM_APP = """\
from aws_cdk import App, Stack, Validations
from aws_cdk import aws_ssm as ssm
from cdk_nag import AwsSolutionsChecks

import handlers
import models
import stacks

app = App()
team = Stack(app, "team-stack")
ssm.StringParameter(team, "Owner", string_value=models.OWNER + handlers.KIND + stacks.KIND)
Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
"""


def test_a_team_repository_with_its_own_packages_adds_one_endpoint_to_its_cdk_app(installed: Installed) -> None:
    # GIVEN a team repository with its own `models`, `handlers` and `stacks` packages and its own CDK app, whose
    # cdk.json sets none of servestack's feature flags
    team = installed.home / "team"
    for package, text in (("models", 'OWNER = "team"\n'), ("handlers", 'KIND = "-web"\n'), ("stacks", 'KIND = ""\n')):
        (team / package).mkdir(parents=True)
        (team / package / "__init__.py").write_text(text)
    (team / "app.py").write_text(TEAM_APP)
    (team / "cdk.json").write_text(json.dumps({"app": "python3 app.py"}))
    commands, spec, lines, synth = doc_blocks_run_here(EXISTING)
    # WHEN docs/existing-cdk-app.md's `servestack init --existing-cdk-app` and `models push` run there
    done = installed.shell(commands, cwd=team, **{"path/to/model.onnx": str(bundled_onnx(installed))})
    # THEN init wrote serving.yaml alone (and the push its package), and printed the page's two lines
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(str(p.relative_to(team)) for p in team.rglob("*") if p.is_file() and "artifacts" not in p.parts) == [
        "app.py", "cdk.json", "handlers/__init__.py", "models/__init__.py", "serving.yaml", "stacks/__init__.py",
    ]  # fmt: skip
    printed = [line.strip() for line in done.stdout.splitlines() if line.startswith("    ")]
    assert printed == [line for line in lines.text.splitlines() if line.strip()]

    # WHEN the page's serving.yaml (one endpoint) and its two lines go into the app, after `app = App()`, and
    # the app is synthesized as the page says
    (team / "serving.yaml").write_text(spec.text)
    app = (team / "app.py").read_text().replace("app = App()\n", "app = App()\n" + lines.text)
    (team / "app.py").write_text(app)
    synthesized = installed.shell(synth, cwd=team)
    # THEN the team's stack and the endpoint's synthesize together, cdk-nag and cfn-lint clean
    assert synthesized.returncode == 0, synthesized.stdout[-3000:] + synthesized.stderr[-3000:]
    out = team / "cdk.out"
    assert sorted(p.name for p in out.glob("*.template.json")) == [
        "servestack-team-api.template.json",
        "team-stack.template.json",
    ]
    linted = cfn_lint([str(out / "servestack-team-api.template.json")])
    assert linted.returncode == 0, linted.stdout + linted.stderr
    # AND the function runs servestack's own entry points, not the team's `handlers` package, and answers
    bundle = function_bundle(out, "servestack-team-api")
    assert "servestack.adapters.serverless" in (bundle / "handlers" / "serverless.py").read_text()
    package = team / "models" / "artifacts" / "digits" / "1"
    reply = answer_from_bundle(bundle, package / "sample-request.json", "digits", installed.home)
    assert reply["statusCode"] == 200, reply


def test_the_installed_servestack_is_the_environments_not_this_checkouts(installed: Installed) -> None:
    # GIVEN the environment's Python run from a folder outside the repository
    done = installed.run(str(installed.bin / "python"), "-c", "import servestack; print(servestack.__file__)",
                         cwd=installed.home)  # fmt: skip
    # THEN servestack comes from the environment's site-packages, never from this checkout
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(installed.bin.parent)
