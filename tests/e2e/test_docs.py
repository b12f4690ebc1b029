"""The docs are executed: every code block of README.md and docs/*.md runs here, or says why it cannot.

Marker convention (for whoever edits the docs next)
---------------------------------------------------
A block may carry one marker: an HTML comment on the line right above its opening fence (GitHub does not
render it). The kind comes first, then options after a colon, then, after a semicolon, a note for humans:

    <!-- runnable -->                            the default for ```bash / ```sh / ```shell / ```python blocks
    <!-- runnable: repo; writes models/... -->   same: in the `repo` fixture (below), with a note
    <!-- runnable: project=iris -->              in the scratch project folder `iris` (below)
    <!-- runnable: project=iris, background -->  a long-running command (`servestack local up`): started,
                                                 waited for, stopped once every block has run
    <!-- runnable: project=iris, file=check.py -->  a ```python block saved as check.py in the folder, then
                                                 run there as `python check.py`
    <!-- runnable: timeout=300 -->               seconds before the block counts as hung (default 180)
    <!-- file: serving.yaml, project=iris -->    the block is that file's content: written into the folder
                                                 (YAML must parse, a serving.yaml must pass its schema,
                                                 Python must compile), not run
    <!-- output -->, <!-- output of `cmd` -->    the block shows output (or a usage synopsis), not a command.
                                                 `output of `make local`` is compared with what the `repo`
                                                 fixture's `local up` printed (numbers and paths aside)
    <!-- cloud-only: REASON -->                  needs AWS (an account, credentials, a deployed stack)
    <!-- not-run: REASON -->                     runs on a developer's machine but not in this suite (it is
                                                 the suite itself, or needs Docker)

An unmarked ```yaml / ```json block must parse, and a YAML block with `models` and `deployments` must pass
serving.yaml's schema. A block with no language, or another one, must be marked. Every mistake (a block
neither runnable nor marked, an unknown kind or option, a marker that is not right above a fence, a
cloud-only or not-run marker without a reason) fails `test_every_block_is_runnable_or_marked`, which
needs no server.

Fixtures: blocks of one fixture run in document order (README.md, then docs/*.md by name), each in a
fresh `bash -e -o pipefail` (or the repository's Python), with `.venv/bin` first on PATH and no
`SERVESTACK_*` or `AWS_*` variables, as in a new shell.
- `repo`: a copy of this repository's project (the CDK app, stacks, containers, model artifacts,
  serving.yaml, Makefile, tests/events; `.venv`, `.tools` and `node_modules` linked), so blocks that write
  (`models push` writes models/artifacts/<name>/<version>/) leave the repository alone. `servestack local
  up` runs in it, started by the test as `make local` starts it.
- `project=NAME`: an empty folder; its blocks build the project (`touch serving.yaml`, `file:` blocks,
  `models push`) and start `local up` with a `background` block.

Ports: every `local up` here runs on free ports (two suites at once on one machine must not collide): the
test passes `--port` and `--aws-port` (appended to a `background` block's `servestack local up`), and
replaces the documented defaults `127.0.0.1:8080` (the first realtime endpoint's container) and
`127.0.0.1:8090` (boto3's endpoint_url for sagemaker-runtime and lambda) in the fixture's blocks with them.
Blocks that read `.servestack/local.json` need no substitution.

`python -m tests.e2e.test_docs` prints the blocks that are not run (cloud-only and not-run) with their
reasons, as a Markdown list.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/*.md", "localstack/README.md")
VENV_BIN = Path(sys.executable).parent
SHELLS = ("bash", "sh", "shell")
PYTHONS = ("python", "py")
DATA = ("yaml", "yml", "json")
KINDS = ("runnable", "file", "output", "cloud-only", "not-run")
RUNNABLE_OPTIONS = ("repo", "project", "background", "file", "timeout")
DEFAULT_TIMEOUT_SEC = 180
DOCUMENTED_PORTS = {"realtime": 8080, "aws": 8090}  # local up's defaults, as the docs write them

FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
COMMENT = re.compile(r"^\s*<!--\s*(?P<text>.*?)\s*-->\s*$")
MARKER = re.compile(r"^(?P<kind>[a-z][a-z-]*)\b\s*(?P<colon>:)?\s*(?P<body>.*)$", re.DOTALL)


# ------------------------------------------------------------------------------------------ the parser


class DocError(ValueError):
    """A block or marker the convention above does not allow; the message names the file and line."""


@dataclass(frozen=True)
class Marker:
    kind: str
    options: dict[str, str] = field(default_factory=dict)  # runnable and file: key=value (flags map to "")
    text: str = ""  # cloud-only and not-run: the reason; output: what it is the output of; else the note


@dataclass(frozen=True)
class Block:
    document: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    marker: Marker | None

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def kind(self) -> str:
        """The marker's kind, else `runnable` for shell and Python, else `data` for YAML and JSON."""
        if self.marker is not None:
            return self.marker.kind
        if self.language in SHELLS + PYTHONS:
            return "runnable"
        if self.language in DATA:
            return "data"
        raise DocError(
            f"{self.where}: a ```{self.language or '(no language)'} block needs a marker "
            f"({', '.join(KINDS)}): see tests/e2e/test_docs.py"
        )

    @property
    def options(self) -> dict[str, str]:
        return self.marker.options if self.marker else {}

    @property
    def fixture(self) -> str:
        """`repo`, or `project=NAME`."""
        project = self.options.get("project")
        return f"project={project}" if project else "repo"


def parse_marker(text: str, where: str) -> Marker | None:
    """The marker in an HTML comment's text, None when the comment is not one (its first word is no kind)."""
    found = MARKER.match(text)
    if not found or found["kind"] not in KINDS:
        return None
    kind, body = found["kind"], found["body"].strip()
    if kind in ("cloud-only", "not-run"):
        if not found["colon"] or not body:
            raise DocError(f"{where}: `<!-- {kind}: REASON -->` needs a reason")
        return Marker(kind, text=body)
    if kind == "output":
        return Marker(kind, text=body)
    spec, _, note = body.partition(";")
    items = [item.strip() for item in spec.split(",") if item.strip()]
    options: dict[str, str] = {}
    if kind == "file":
        if not items or "=" in items[0]:
            raise DocError(f"{where}: `<!-- file: PATH[, project=NAME] -->` needs the file's path first")
        options["path"], items = items[0], items[1:]
    allowed = RUNNABLE_OPTIONS if kind == "runnable" else ("project",)
    for item in items:
        key, _, value = item.partition("=")
        if key not in allowed:
            raise DocError(f"{where}: {key!r} is not an option of {kind}; allowed: {', '.join(allowed)}")
        options[key.strip()] = value.strip()
    if options.get("project") == "" or ("timeout" in options and not options["timeout"].isdigit()):
        raise DocError(f"{where}: {spec!r}: project=NAME and timeout=SECONDS need a value")
    return Marker(kind, options, note.strip())


def parse_blocks(text: str, document: str) -> list[Block]:
    """Every fenced block of a Markdown text, with the marker right above it. A small parser of CommonMark's
    fences (``` or ~~~, indented in list items, closed by a fence of the same character at least as long):
    the docs need no more, and a Markdown library would add a dependency for these twenty lines."""
    lines = text.split("\n")
    blocks: list[Block] = []
    attached: set[int] = set()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        language = opening["info"].strip().split(" ")[0].lower() if opening["info"].strip() else ""
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = FENCE.match(lines[end])
            if closing and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence):
                if not closing["info"].strip():
                    break
            body.append(lines[end][indent:] if lines[end][:indent].strip() == "" else lines[end].lstrip())
            end += 1
        if end == len(lines):
            raise DocError(f"{document}:{index + 1}: the ``` block opened here is never closed")
        marker = None
        comment = COMMENT.match(lines[index - 1]) if index > 0 else None
        if comment:
            marker = parse_marker(comment["text"], f"{document}:{index}")
            if marker is not None:
                attached.add(index - 1)
        blocks.append(Block(document, index + 1, language, "\n".join(body) + "\n", marker))
        index = end + 1
    for number, line in enumerate(lines):
        comment = COMMENT.match(line)
        if comment and number not in attached and parse_marker(comment["text"], f"{document}:{number + 1}"):
            raise DocError(f"{document}:{number + 1}: a marker must be on the line right above a block's fence")
    return blocks


def document_paths(root: Path = REPO_ROOT) -> list[Path]:
    found: list[Path] = []
    for pattern in DOCUMENTS:
        found += sorted(root.glob(pattern))
    return found


def all_blocks(root: Path = REPO_ROOT) -> list[Block]:
    blocks: list[Block] = []
    for path in document_paths(root):
        blocks += parse_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return blocks


# ------------------------------------------------------------------------------------------ static checks


def check_data(block: Block, path: str | None = None) -> None:
    """What a block that is not run must be: YAML that parses (and passes serving.yaml's schema when it is
    one), JSON that parses, Python that compiles."""
    from servestack.spec import SpecError, parse_spec

    name = Path(path).name if path else ""
    try:
        if block.language in ("yaml", "yml"):
            data = yaml.safe_load(block.text)
            if name == "serving.yaml" or (isinstance(data, dict) and {"models", "deployments"} <= set(data)):
                parse_spec(data, f"{block.where} (serving.yaml)")
        elif block.language == "json":
            json.loads(block.text)
        elif block.language in PYTHONS:
            compile(block.text, block.where, "exec")
    except (yaml.YAMLError, ValueError, SyntaxError, SpecError) as error:
        raise DocError(f"{block.where}: the ```{block.language} block is not valid: {error}") from None


def check_block(block: Block) -> None:
    kind = block.kind
    options = block.options
    if kind == "runnable":
        if block.language not in SHELLS + PYTHONS:
            raise DocError(f"{block.where}: only shell and Python blocks are runnable, not {block.language!r}")
        if "repo" in options and "project" in options:
            raise DocError(f"{block.where}: `repo` and `project=` are two fixtures; name one")
        if "background" in options and (block.language not in SHELLS or len(commands(block.text)) != 1):
            raise DocError(f"{block.where}: a background block is one shell command")
        if "file" in options and block.language not in PYTHONS:
            raise DocError(f"{block.where}: file= saves a Python block; write a shell block's files with `file:`")
    elif kind == "file":
        check_data(block, options["path"])
    elif kind == "data":
        check_data(block)


def commands(script: str) -> list[str]:
    """The commands of a shell block: its lines without comments, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", script)
    return [line for line in (shlex.join(shlex.split(raw, comments=True)) for raw in joined.splitlines()) if line]


def not_run(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.kind in ("cloud-only", "not-run")]


def not_run_report(blocks: list[Block]) -> str:
    lines = ["Doc blocks the tests do not run (tests/e2e/test_docs.py):"]
    for block in not_run(blocks):
        assert block.marker is not None
        first = commands(block.text)[:1] if block.language in SHELLS else block.text.strip().splitlines()[:1]
        lines.append(f"- {block.where} ({block.marker.kind}) `{first[0] if first else ''}`: {block.marker.text}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ fixtures


def clean_environment() -> dict[str, str]:
    """A new shell's environment: the repository's .venv/bin first on PATH, no servestack or AWS settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVESTACK_", "AWS_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


REPO_FILES = ("Makefile", "pyproject.toml", "uv.lock", "package.json", "package-lock.json", "tests/events")
REPO_LINKS = (".venv", ".tools", "node_modules")


def copy_repository(target: Path) -> None:
    """The `repo` fixture's folder: the project as tests/e2e/conftest.py copies it, plus what `make` and the
    docs' blocks read. Modification times are kept, so make finds .venv and node_modules up to date."""
    import shutil

    from tests.e2e.conftest import copy_project

    copy_project(target, (REPO_ROOT / "serving.yaml").read_text(encoding="utf-8"))
    for item in REPO_FILES:
        source, destination = REPO_ROOT / item, target / item
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, destination)
        else:
            shutil.copy2(source, destination)
    for item in REPO_LINKS:
        (target / item).symlink_to(REPO_ROOT / item)


@dataclass
class Fixture:
    name: str
    folder: Path
    ports: dict[str, int]
    env: dict[str, str]
    processes: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    failed: str | None = None  # the block that failed first: later ones depend on it

    @property
    def state_file(self) -> Path:
        return self.folder / ".servestack" / "local.json"

    def substitute(self, text: str) -> str:
        for role, documented in DOCUMENTED_PORTS.items():
            for host in ("127.0.0.1", "localhost"):
                text = text.replace(f"{host}:{documented}", f"{host}:{self.ports[role]}")
        return text

    def start_local_up(self, argv: list[str], timeout_sec: float = 300) -> None:
        """`servestack local up` in the folder, on this fixture's ports; returns once its state file exists."""
        self.state_file.unlink(missing_ok=True)
        log_path = self.folder.parent / f"{self.name}-local-up-{len(self.processes)}.log"
        argv = [*argv, "--port", str(self.ports["realtime"]), "--aws-port", str(self.ports["aws"])]
        with log_path.open("wb") as log:
            process = subprocess.Popen(argv, cwd=self.folder, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append((process, log_path))
        deadline = time.monotonic() + timeout_sec
        while not self.state_file.exists():
            if process.poll() is not None:
                raise AssertionError(f"{shlex.join(argv)} exited ({process.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{shlex.join(argv)} not ready after {timeout_sec}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def local_up_output(self) -> str:
        return self.processes[0][1].read_text(errors="replace") if self.processes else ""

    def log_tail(self, chars: int = 4000) -> str:
        if not self.processes:
            return ""
        return f"--- local up ({self.processes[-1][1]}):\n{self.processes[-1][1].read_text(errors='replace')[-chars:]}"

    def stop(self) -> list[str]:
        """Stops every background process; the ones that did not exit cleanly, with their logs."""
        problems = []
        for process, log_path in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            if code != 0:
                problems.append(f"{self.name}: exit {code}\n{log_path.read_text(errors='replace')[-3000:]}")
        return problems


class DocsRun:
    """The fixtures of one test session, made when a block first needs one."""

    def __init__(self, workdir: Path) -> None:
        from servestack.local.processes import free_port

        self.workdir = workdir
        self.free_port: Callable[[], int] = free_port
        self.fixtures: dict[str, Fixture] = {}

    def fixture(self, name: str) -> Fixture:
        if name not in self.fixtures:
            folder = self.workdir / name.replace("project=", "")
            folder.mkdir()
            ports = {"realtime": self.free_port(), "aws": self.free_port()}
            fixture = Fixture(name, folder, ports, clean_environment())
            self.fixtures[name] = fixture
            if name == "repo":
                copy_repository(folder)
                fixture.start_local_up([str(folder / ".venv/bin/servestack"), "local", "up"])
        return self.fixtures[name]

    def run(self, block: Block) -> None:
        fixture = self.fixture(block.fixture)
        if fixture.failed:
            pytest.fail(f"{block.where} not run: an earlier block of {fixture.name} failed ({fixture.failed})")
        try:
            self._run(block, fixture)
        except BaseException:
            fixture.failed = block.where
            raise

    def _run(self, block: Block, fixture: Fixture) -> None:
        options = block.options
        if block.kind == "file":
            check_data(block, options["path"])
            target = fixture.folder / options["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text, encoding="utf-8")
            return
        if block.kind == "output":
            compare_output(block, fixture)
            return
        text = fixture.substitute(block.text)
        if "background" in options:
            (command,) = commands(text)
            fixture.start_local_up(shlex.split(command))
            return
        scripts = self.workdir / "scripts"
        scripts.mkdir(exist_ok=True)
        if block.language in PYTHONS:
            script = fixture.folder / options["file"] if options.get("file") else scripts / f"{block.line}.py"
            script.write_text(text, encoding="utf-8")
            argv = [str(VENV_BIN / "python"), str(script)]
        else:
            script = scripts / f"{Path(block.document).stem}-{block.line}.sh"
            script.write_text(text, encoding="utf-8")
            argv = ["bash", "-e", "-o", "pipefail", str(script)]
        timeout = int(options.get("timeout") or DEFAULT_TIMEOUT_SEC)
        try:
            done = subprocess.run(
                argv, cwd=fixture.folder, env=fixture.env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as hung:
            pytest.fail(f"{block.where}: still running after {timeout}s:\n{text}\n{hung.stdout}\n{fixture.log_tail()}")
        assert done.returncode == 0, (
            f"{block.where}: exit {done.returncode} in {fixture.folder}\n--- block as run:\n{text}"
            f"--- stdout:\n{done.stdout[-4000:]}\n--- stderr:\n{done.stderr[-4000:]}\n{fixture.log_tail()}"
        )

    def stop(self) -> list[str]:
        return [problem for fixture in self.fixtures.values() for problem in fixture.stop()]


# ------------------------------------------------------------------------------------------ outputs


def normalized(line: str, roots: tuple[Path, ...]) -> str:
    """A line of output with what changes from run to run made equal: the project's and servestack's own
    folders (printed as absolute paths), numbers (ports, seconds), and runs of spaces."""
    for root in roots:
        line = line.replace(f"{root}/", "")
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return re.sub(r"\s+", " ", line).strip()


OUTPUT_SOURCES = {"`make local`": "repo"}  # `output of X` blocks compared with what a fixture printed


def compare_output(block: Block, fixture: Fixture) -> None:
    """Every line of the block appears, in order, in the fixture's local up output (others may come between:
    the children's logs, lines the doc leaves out)."""
    roots = (fixture.folder, fixture.folder.resolve(), REPO_ROOT)
    printed = [normalized(line, roots) for line in fixture.local_up_output().splitlines()]
    position = 0
    for expected in (normalized(line, roots) for line in block.text.splitlines()):
        if not expected:
            continue
        try:
            position = printed.index(expected, position) + 1
        except ValueError:
            pytest.fail(
                f"{block.where}: the documented output has a line local up did not print (numbers and paths "
                f"normalized):\n  {expected}\n--- what it printed:\n{fixture.local_up_output()[-5000:]}"
            )


# ------------------------------------------------------------------------------------------ tests


def executed(blocks: list[Block]) -> list[Block]:
    """The blocks the suite runs, in order: runnable and file blocks, and outputs it can compare."""
    chosen = []
    for block in blocks:
        if block.kind in ("runnable", "file"):
            chosen.append(block)
        elif block.kind == "output" and block.marker and block.marker.text.removeprefix("of ") in OUTPUT_SOURCES:
            chosen.append(block)
    return chosen


def _blocks_or_nothing() -> list[Block]:
    """The blocks to parametrize with; a parse error surfaces in test_every_block_is_runnable_or_marked."""
    try:
        blocks = all_blocks()
        for block in blocks:
            check_block(block)
    except DocError:
        return []
    return executed(blocks)


def test_every_block_is_runnable_or_marked() -> None:
    # GIVEN every Markdown document of the repository that holds user-facing commands
    # WHEN each block is parsed and checked against the marker convention
    problems = []
    try:
        blocks = all_blocks()
    except DocError as error:
        pytest.fail(str(error))
    for block in blocks:
        try:
            check_block(block)
        except DocError as error:
            problems.append(str(error))
    # THEN each one is runnable, valid data, or marked (with a reason when it is not run)
    assert not problems, "\n".join(problems)
    assert len(executed(blocks)) >= 10  # the walkthrough and the repo's commands, at least


@pytest.fixture(scope="module")
def docs_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsRun]:
    run = DocsRun(tmp_path_factory.mktemp("docs"))
    yield run
    problems = run.stop()
    assert not problems, "\n\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("block", _blocks_or_nothing(), ids=lambda b: f"{b.where}-{b.kind}")
def test_block(block: Block, docs_run: DocsRun) -> None:
    # GIVEN the block's fixture (the repository's copy with local up running, or a scratch project), set up
    # by the blocks before it
    # WHEN it runs as a user would run it (a file block is written, an output block compared)
    # THEN it succeeds
    docs_run.run(block)


if __name__ == "__main__":
    print(not_run_report(all_blocks()))
