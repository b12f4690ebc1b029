"""`cdk synth` for local mode, skipped when nothing it reads has changed.

`local up` starts from the synthesized templates, as `cdk deploy` does. Synthesis runs the project's CDK app
exactly as the CDK CLI runs it: cdk.json's `app` command, in the project's folder, with `CDK_OUTDIR` and
`CDK_CONTEXT_JSON` holding the context of cdk.json, cdk.context.json and ~/.cdk.json, in the CLI's order of
precedence, into `.servestack/cdk.out`. An app run by Python (`python3 app.py`, `.venv/bin/python app.py`) runs
on this interpreter, the one servestack and aws-cdk-lib are installed in. Lambda bundling is skipped
(`aws:cdk:bundling-stacks: []`): each function's code asset is then the folder of sources the app staged for
its bundle (servestack/cdk/bundling.py), which local mode runs, as SAM CLI runs a function's code directory.
Everything else (names, IAM, environments, SageMaker variants) is what `cdk deploy` would create.
aws-cdk-lib's built-in CloudFormation validation is skipped (`CDK_VALIDATION=false`) where it could only
warn: see `validation_can_fail`.

The output is reused while the inputs are unchanged: a SHA-256 over serving.yaml, the CDK app and its
constructs, cdk.json / cdk.context.json / ~/.cdk.json, the model artifacts the templates package, and the
versions of Python and aws-cdk-lib. The digest of each file is kept next to it (`servestack-inputs.json`), so
that a new synth says which inputs changed; `on_decision` hears the decision (reused, or why not) before the
app runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

INPUTS_FILE = "servestack-inputs.sha256"
INPUT_FILES = "servestack-inputs.json"  # each input's own digest: what changed since the last synth
# What the CDK app reads, relative to the project (or servestack's own) root.
SOURCE_GLOBS = ("app.py", "cdk.json", "cdk.context.json", "stacks/**/*.py", "handlers/**/*.py",
                "models/artifacts/**/*")  # fmt: skip
# What the app reads of servestack itself (its constructs, serving.yaml's schema, the sources its bundles and
# images carry), relative to the servestack package the app imports.
FRAMEWORK_GLOBS = ("*.py", "spec/**/*.py", "cdk/**/*", "inference/**/*.py", "adapters/**/*.py")
INSTALLED_FRAMEWORK = Path(__file__).resolve().parents[2]


def framework_dir(root: Path) -> Path:
    """The servestack package `python app.py` in `root` imports: a `servestack/` package beside app.py comes
    first on its path (a checkout of servestack itself), else the installed one."""
    return root / "servestack" if (root / "servestack" / "__init__.py").is_file() else INSTALLED_FRAMEWORK


class SynthError(RuntimeError):
    """The CDK app failed; the message carries the app's own error (a serving.yaml problem, usually)."""


@dataclass(frozen=True)
class SynthResult:
    out_dir: Path
    reused: bool
    seconds: float
    reason: str = ""  # why it was synthesized, or that the inputs are unchanged


PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)*)?$")


def app_command(root: Path) -> list[str]:
    """The command that runs the project's CDK app: cdk.json's `app`, with a Python interpreter replaced by this
    one. A project without it is a `SynthError` saying how to get one."""
    settings = root / "cdk.json"
    try:
        app = json.loads(settings.read_text(encoding="utf-8")).get("app") if settings.is_file() else None
    except (OSError, ValueError, AttributeError) as error:
        raise SynthError(f"{settings}: not readable JSON ({error})") from None
    if not isinstance(app, str) or not app.strip():
        raise SynthError(
            f'{settings} names no CDK app (`"app": "python3 app.py"`): `servestack init` writes a project '
            "with one, and `servestack init --existing-cdk-app` says what to add to your own app"
        )
    words = shlex.split(app)
    if PYTHON.match(words[0]):
        return [sys.executable, *words[1:]]
    return ["/bin/sh", "-c", app]  # as the CDK CLI runs an app command


def project_context(root: Path) -> dict[str, object]:
    """The context the CDK CLI gives the app in `root` from its files, with the CLI's precedence: cdk.json's
    `context` over cdk.context.json over the `context` of the user's ~/.cdk.json. A file that is not JSON is a
    `SynthError` naming it, as the CLI stops on it."""
    merged: dict[str, object] = {}
    for path, key in ((user_settings(), "context"), (root / "cdk.context.json", None), (root / "cdk.json", "context")):
        if not path.is_file():
            continue
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise SynthError(f"{path}: not readable JSON ({error})") from None
        found = loaded.get(key, {}) if key is not None and isinstance(loaded, dict) else loaded
        if isinstance(found, dict):
            merged |= found
    return merged


def user_settings() -> Path:
    """The CDK CLI's user settings file, whose `context` every app on the machine gets."""
    return Path.home() / ".cdk.json"


def context(root: Path, spec: Path, *, pipeline: bool = False) -> dict[str, object]:
    """The context the CDK CLI would pass (`project_context`), plus local mode's own; with `pipeline`, the app's
    pipeline stack too (its context, `servestack:repo`..., is cdk.json's)."""
    merged = project_context(root)
    merged["servestack:spec"] = str(spec.resolve())
    merged["servestack:project"] = str(spec.resolve().parent)
    merged["servestack:pipeline"] = pipeline  # the pipeline stack deploys nothing local up runs
    merged["aws:cdk:bundling-stacks"] = []
    # What local mode deployed is its previous synth: the guards of SageMaker updates (servestack/cdk/
    # scaling_guard.py) compare with that, never with an AWS account a SERVESTACK_COMPARE_WITH may point them at.
    merged["servestack:compare-with"] = "last-synth"
    return merged


def input_files(root: Path, spec: Path, artifacts: Path | None = None) -> dict[str, str]:
    """Each input file (its path) -> the SHA-256 of its bytes, plus the interpreter's and aws-cdk-lib's versions."""
    files = {p for pattern in SOURCE_GLOBS for p in root.glob(pattern) if p.is_file()}
    framework = framework_dir(root)
    files |= {p for pattern in FRAMEWORK_GLOBS for p in framework.glob(pattern) if p.is_file()}
    if artifacts is not None and artifacts.is_dir():
        files |= {p for p in artifacts.rglob("*") if p.is_file()}
    settings = user_settings()
    if settings.is_file():  # its context reaches the app too
        files.add(settings)
    found: dict[str, str] = {}
    for path in sorted(files | {spec.resolve()}):
        if "__pycache__" in path.parts:
            continue
        found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        cdk_version = metadata.version("aws-cdk-lib")
    except metadata.PackageNotFoundError:
        cdk_version = "absent"
    found["(versions)"] = f"python {sys.version_info[:3]} aws-cdk-lib {cdk_version}"
    return found


def digest_of(files: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for path, value in files.items():
        if path == "(versions)":
            continue
        digest.update(path.encode() + b"\0")
        digest.update(bytes.fromhex(value))
    digest.update(files["(versions)"].encode())
    return digest.hexdigest()


def inputs_digest(root: Path, spec: Path, artifacts: Path | None = None) -> str:
    return digest_of(input_files(root, spec, artifacts))


def changed_inputs(before: dict[str, str], now: dict[str, str], root: Path, limit: int = 3) -> str:
    """`serving.yaml, servestack/cdk/realtime.py changed` (at most `limit` names, then how many more)."""
    names: list[str] = []
    for path in sorted(set(before) | set(now)):
        if before.get(path) != now.get(path):
            shown = Path(path)
            parts = shown.relative_to(root).parts if shown.is_relative_to(root) else (shown.name,)
            if parts[:2] == ("models", "artifacts") and len(parts) >= 4:  # a model package: its folder, once
                parts = (*parts[:3], parts[3].removesuffix(".tar.gz"))
            if "/".join(parts) not in names:
                names.append("/".join(parts))
    if not names:
        return "inputs changed"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{', '.join(names[:limit])}{more} changed"


def synthesize(
    project_root: Path,
    spec: Path,
    out_dir: Path,
    *,
    force: bool = False,
    artifacts: Path | None = None,
    pipeline: bool = False,
    on_decision: Callable[[str], None] | None = None,
) -> SynthResult:
    """Templates for `spec` in `out_dir`: reused when the inputs' digest matches, synthesized otherwise.
    `on_decision` is told which, and why, before the CDK app runs."""
    root = project_root
    command = app_command(root)
    started = time.monotonic()
    files = input_files(root, spec, artifacts)
    wanted = digest_of(files)
    marker = out_dir / INPUTS_FILE
    reason = _reason(out_dir, marker, files, wanted, root, force)
    if on_decision is not None:
        on_decision(reason)
    if reason == REUSED:
        return SynthResult(out_dir, True, time.monotonic() - started, reason)
    out_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    app_context = context(root, spec, pipeline=pipeline)
    env = {
        **os.environ,
        "CDK_OUTDIR": str(out_dir),
        "CDK_CONTEXT_JSON": json.dumps(app_context),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": os.environ.get(
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20"
        ),
        "CDK_DISABLE_CLI_TELEMETRY": "true",
    }
    if not validation_can_fail(app_context) and "CDK_VALIDATION" not in os.environ:
        env["CDK_VALIDATION"] = "false"
    env.pop("AWS_ENDPOINT_URL", None)
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        # The app prints `servestack: <problem>` for serving.yaml errors; otherwise the last lines say why.
        lines = [line for line in detail if line.startswith("servestack:")] or detail[-12:]
        raise SynthError("cdk synth failed:\n" + "\n".join(lines))
    marker.write_text(wanted + "\n")
    (out_dir / INPUT_FILES).write_text(json.dumps(files, indent=1) + "\n")
    return SynthResult(out_dir, False, time.monotonic() - started, reason)


REUSED = "reusing the templates: inputs unchanged"

# aws-cdk-lib's own CloudFormation validation at synth (a WebAssembly rule engine, more than half of a synth's
# CPU) can fail the synth only when this context key is true; otherwise its findings are turned into warnings.
VALIDATE_AGAINST_DEFAULT_RULES = "@aws-cdk/core:validateAgainstDefaultRules"


def validation_can_fail(app_context: Mapping[str, object]) -> bool:
    """Whether aws-cdk-lib's built-in validation can fail `cdk synth` with this context: only with
    `VALIDATE_AGAINST_DEFAULT_RULES` set, and not to false (aws-cdk-lib reads the key so). When it cannot, local
    mode synthesizes with `CDK_VALIDATION=false`: the templates are the same, and the synth costs half the CPU."""
    if VALIDATE_AGAINST_DEFAULT_RULES not in app_context:
        return False
    value = app_context[VALIDATE_AGAINST_DEFAULT_RULES]
    return value is not False and value != "false"


def _reason(out_dir: Path, marker: Path, files: dict[str, str], wanted: str, root: Path, force: bool) -> str:
    """REUSED, or why the app runs: --resynth, no earlier synth, or which inputs changed."""
    if force:
        return "synthesizing: --resynth"
    if not marker.is_file() or not (out_dir / "manifest.json").exists():
        return f"synthesizing: no earlier synth in {out_dir.name}"
    if marker.read_text().strip() == wanted:
        return REUSED
    try:
        before: dict[str, str] = json.loads((out_dir / INPUT_FILES).read_text())
    except (OSError, ValueError):
        return "synthesizing: inputs changed"
    return f"synthesizing: {changed_inputs(before, files, root)}"


def stack_templates(out_dir: Path) -> dict[str, Path]:
    """Stack name -> template path, from the cloud assembly's manifest."""
    manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    found: dict[str, Path] = {}
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        if artifact.get("type") == "aws:cloudformation:stack":
            properties = artifact.get("properties", {})
            name = properties.get("stackName", artifact_id)
            found[name] = out_dir / properties["templateFile"]
    return found
