"""The docs are executed: every code block of README.md, docs/*.md and localstack/README.md runs here, or its
marker says why it cannot.

Marker convention (for whoever edits the docs next)
---------------------------------------------------
A block may carry one marker: an HTML comment on the line right above its opening fence (GitHub does not
render it). The kind comes first, then options after a colon, then, after a semicolon, a note for humans:

    <!-- runnable -->                            the default for ```bash / ```sh / ```shell / ```python blocks
    <!-- runnable: repo; writes models/... -->   the same (the `repo` fixture, below), with a note
    <!-- runnable: project=iris -->              in the scratch project folder `iris` (below)
    <!-- runnable: project=iris, background -->  one long-running command (`servestack local up`): started,
                                                 waited for, stopped once every block has run
    <!-- runnable: project=iris, file=check.py -->  a ```python block saved as check.py in the folder and
                                                 run there as `python check.py`
    <!-- runnable: timeout=300 -->               seconds before the block counts as hung (default 180)
    <!-- file: serving.yaml, project=iris -->    the block is that file's content: written into the folder,
                                                 not run (YAML must parse, a serving.yaml must pass its
                                                 schema, Python must compile)
    <!-- output -->, <!-- output of `cmd` -->    the block shows output (or a usage synopsis), not a command;
                                                 `output of `make local`` is compared with what the `repo`
                                                 fixture's local up printed (numbers and paths aside)
    <!-- tested: tests/e2e/test_x.py; note -->   run as written by that test module, which reads the block
                                                 from this document (it must exist and name the document)
    <!-- cloud-only: REASON -->                  needs AWS (an account, credentials, a deployed stack)
    <!-- not-run: REASON -->                     runs on a developer's machine but not in this suite (it is
                                                 the suite itself, it rewrites a committed file, it needs
                                                 Docker)

An unmarked ```yaml or ```json block must parse, and a YAML block with `models` and `deployments` must pass
serving.yaml's schema. A block with no language, or another one, must be marked. Every mistake (a block
neither runnable nor marked, an unknown kind or option, a marker that is not right above a fence, a
cloud-only or not-run marker without a reason) fails `test_every_block_is_runnable_or_marked`, which
needs no server.

Fixtures. The blocks of one fixture run in reading order: README.md, then the docs site's pages in the order
of mkdocs.yml's nav (a project's walkthrough may go on over several pages, as a reader follows it), then
localstack/README.md; within a page, top to bottom. The scratch projects' blocks run first, then the repo's,
whose local up starts meanwhile. A shell block is fed to `bash -e -o pipefail`, a Python block to
the repository's `python -` (or `python FILE` with file=), in the fixture's folder, with `.venv/bin` first
on PATH and no `SERVESTACK_*` or `AWS_*` variables, as in a new shell. A failed block fails the later
blocks of its fixture at once.
- `repo`: a copy of this repository's project (the CDK app, stacks, containers, model artifacts,
  serving.yaml, Makefile, tests/events; `.venv`, `.tools` and `node_modules` linked), so that blocks which
  write (`models push` writes models/artifacts/<name>/<version>/) leave the repository alone. The test
  starts `servestack local up` in it, as `make local` does.
- `project=NAME`: an empty folder; its blocks make the project (`touch serving.yaml`, `file:` blocks,
  `models push`) and start its local up with a `background` block.

Ports. Every local up here runs on free ports, so that two suites on one machine cannot collide: the test
passes `--port` and `--aws-port` (appended to a `background` block's command), and replaces the documented
defaults `127.0.0.1:8080` (the first realtime endpoint's container) and `127.0.0.1:8090` (boto3's
endpoint_url for sagemaker-runtime and lambda) with them in the fixture's blocks. Blocks that read
`.servestack/local.json` need no substitution.

Faulty releases. A shell block that rehearses a release with injected faults (`servestack local deploy NAME
... --inject-faults ...`) shows the alarm stopping a faulty green: after the block runs, its outcome JSON
(`--output`, else `.servestack/deploy-NAME.json`) must say `rolled_back`, with no traffic shift to 100% on
the way. Its timings must leave the alarm room to fire during the canary: an interval of at least
`evaluation_periods` + 1 periods (checked without a server).

`python -m tests.e2e.test_docs` prints the blocks that are not run (cloud-only, not-run) with their reasons,
as a Markdown list.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/*.md", "localstack/README.md")  # docs/*.md in mkdocs.yml's nav order (nav_pages)
VENV_BIN = Path(sys.executable).parent
SHELLS = ("bash", "sh", "shell")
PYTHONS = ("python", "py")
DATA = ("yaml", "yml", "json")
KINDS = ("runnable", "file", "output", "tested", "cloud-only", "not-run")
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
    if kind in ("cloud-only", "not-run", "tested"):
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
    if "project" in options and not re.fullmatch(r"[a-z][a-z0-9-]*", options["project"]):
        raise DocError(f"{where}: project={options['project']!r}: a project is named in lower case, e.g. project=iris")
    if "timeout" in options and not options["timeout"].isdigit():
        raise DocError(f"{where}: timeout={options['timeout']!r}: a number of seconds")
    return Marker(kind, options, note.strip())


def closes(line: str, fence: str) -> bool:
    """Whether `line` closes a block opened by `fence`: the same character, at least as many, no info string."""
    closing = FENCE.match(line)
    if closing is None or closing["info"].strip():
        return False
    return closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence)


def parse_blocks(text: str, document: str) -> list[Block]:
    """Every fenced block of a Markdown text, with the marker right above it. A small parser of CommonMark's
    fences (``` or ~~~, indented in list items, closed by a fence of the same character at least as long):
    the docs need no more, and a Markdown library would be a dependency for this much."""
    lines = text.split("\n")
    blocks: list[Block] = []
    attached: set[int] = set()  # lines of the markers found right above a fence
    inside: set[int] = set()  # lines of the blocks' fences and bodies
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
            if closes(lines[end], fence):
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
        inside.update(range(index, end + 1))
        index = end + 1
    for number, line in enumerate(lines):
        comment = COMMENT.match(line)
        if number in attached or number in inside or not comment:
            continue
        if parse_marker(comment["text"], f"{document}:{number + 1}"):
            raise DocError(f"{document}:{number + 1}: a marker must be on the line right above a block's fence")
    return blocks


def nav_pages(root: Path = REPO_ROOT) -> list[str]:
    """The pages of mkdocs.yml's nav, in its order, relative to docs/."""

    def pages(entries: object) -> list[str]:
        if isinstance(entries, str):
            return [entries]
        if isinstance(entries, list):
            return [page for entry in entries for page in pages(entry)]
        if isinstance(entries, dict):
            return [page for value in entries.values() for page in pages(value)]
        return []

    config = yaml.safe_load((root / "mkdocs.yml").read_text(encoding="utf-8"))
    return pages(config.get("nav", []))


def document_paths(root: Path = REPO_ROOT) -> list[Path]:
    """Every document, in reading order: a glob's files sorted, except docs/*.md, which follow the nav (pages
    outside it, which `mkdocs build --strict` refuses, come after it)."""
    found: list[Path] = []
    for pattern in DOCUMENTS:
        matched = sorted(root.glob(pattern))
        if pattern == "docs/*.md":
            order = {page: position for position, page in enumerate(nav_pages(root))}
            matched.sort(key=lambda path: order.get(path.name, len(order)))
        found += matched
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
        if "background" in options and (
            block.language not in SHELLS
            or len(commands(block.text)) != 1
            or not commands(block.text)[0].startswith("servestack local up")
        ):
            raise DocError(f"{block.where}: a background block is one shell command: servestack local up [...]")
        if "file" in options and block.language not in PYTHONS:
            raise DocError(f"{block.where}: file= saves a Python block; write a shell block's files with `file:`")
    elif kind == "file":
        check_data(block, options["path"])
    elif kind == "data":
        check_data(block)
    elif kind == "tested":
        module = REPO_ROOT / block.marker.text.split()[0] if block.marker else REPO_ROOT
        if not module.is_file() or Path(block.document).name not in module.read_text(encoding="utf-8"):
            raise DocError(f"{block.where}: tested: names {module}, which is no test module reading {block.document}")


def checked(markdown: str, document: str = "doc.md") -> list[Block]:
    """The blocks of a Markdown text, each checked; the first mistake raises."""
    blocks = parse_blocks(markdown, document)
    for block in blocks:
        check_block(block)
    return blocks


def commands(script: str) -> list[str]:
    """The commands of a shell block: its lines without comments, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", script)
    return [line for line in (shlex.join(shlex.split(raw, comments=True)) for raw in joined.splitlines()) if line]


def faulty_rehearsal(command: str) -> dict[str, str] | None:
    """The options of a `servestack local deploy NAME ...` command that injects faults (NAME under "name"),
    else None. Options are read as `--key value` or `--key=value`."""
    words = shlex.split(command)
    if words[:3] != ["servestack", "local", "deploy"] or len(words) < 4:
        return None
    options = {"name": words[3]}
    for index, word in enumerate(words[4:], start=4):
        if word.startswith("--"):
            key, equals, value = word.partition("=")
            following = words[index + 1] if index + 1 < len(words) else ""
            options[key] = value if equals else following
    return options if "--inject-faults" in options else None


def check_faulty_rehearsal(options: dict[str, str], folder: Path) -> None:
    """The outcome of a rehearsal with injected faults: rolled back, and green never given all the traffic."""
    outcome_path = folder / (options.get("--output") or f".servestack/deploy-{options['name']}.json")
    outcome = json.loads(outcome_path.read_text(encoding="utf-8"))
    shares = [event["green_percent"] for event in outcome["timeline"] if event["event"] == "traffic shifted"]
    assert outcome["state"] == "rolled_back", f"a faulty green was not rolled back: {outcome['state']}, {shares}"
    assert shares, "the rehearsal shifted no traffic"
    assert max(shares) < 100, f"a faulty green took {max(shares)}% of the traffic: {shares}"


def not_run(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.kind in ("cloud-only", "not-run", "tested")]


def not_run_report(blocks: list[Block]) -> str:
    """A Markdown list: where each block is, its kind, its first command and the reason (or the test)."""
    lines = ["Doc blocks tests/e2e/test_docs.py does not run (tested: another test module runs them):"]
    for block in not_run(blocks):
        assert block.marker is not None
        code = [line.split(" #")[0].strip() for line in block.text.splitlines() if line.strip()[:1] not in ("", "#")]
        first = f"`{code[0]}`" + (f" (+{len(code) - 1} more)" if len(code) > 1 else "") if code else "(empty)"
        lines.append(f"- {block.where}, {block.marker.kind}: {first}: {block.marker.text}")
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
        if (REPO_ROOT / item).exists():
            (target / item).symlink_to(REPO_ROOT / item)


@dataclass
class Fixture:
    name: str
    folder: Path
    ports: dict[str, int]
    env: dict[str, str]
    processes: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    starting: tuple[subprocess.Popen[bytes], str, float] | None = None  # launched, not known to be ready
    # Each process is sent one SIGTERM: local up restores the default handlers as its very last step, so a
    # second SIGTERM in that window would kill it (exit -15) after a clean stop.
    signalled: set[int] = field(default_factory=set)

    @property
    def state_file(self) -> Path:
        return self.folder / ".servestack" / "local.json"

    def substitute(self, text: str) -> str:
        for role, documented in DOCUMENTED_PORTS.items():
            for host in ("127.0.0.1", "localhost"):
                text = text.replace(f"{host}:{documented}", f"{host}:{self.ports[role]}")
        return text

    def launch_local_up(self, argv: list[str]) -> None:
        """`servestack local up` in the folder, on this fixture's ports; `wait_ready` waits for it."""
        self.state_file.unlink(missing_ok=True)
        log_path = self.folder.parent / f"{self.folder.name}-local-up-{len(self.processes)}.log"
        argv = [*argv, "--port", str(self.ports["realtime"]), "--aws-port", str(self.ports["aws"])]
        with log_path.open("wb") as log:
            process = subprocess.Popen(argv, cwd=self.folder, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append((process, log_path))
        self.starting = (process, shlex.join(argv), time.monotonic())

    def wait_ready(self, timeout_sec: float = 300) -> None:
        """Returns once the local up launched last has written its state file (at once if it has)."""
        if self.starting is None:
            return
        process, command, launched = self.starting
        self.starting = None
        while not self.state_file.exists():
            if process.poll() is not None:
                raise AssertionError(f"{command} exited ({process.returncode}):\n{self.log_tail()}")
            if time.monotonic() > launched + timeout_sec:
                raise AssertionError(f"{command} not ready after {timeout_sec}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def local_up_output(self) -> str:
        return self.processes[0][1].read_text(errors="replace") if self.processes else ""

    def log_tail(self, chars: int = 4000) -> str:
        if not self.processes:
            return ""
        return f"--- local up ({self.processes[-1][1]}):\n{self.processes[-1][1].read_text(errors='replace')[-chars:]}"

    def signal_stop(self) -> None:
        for process, _ in self.processes:
            if process.poll() is None and process.pid not in self.signalled:
                process.send_signal(signal.SIGTERM)
                self.signalled.add(process.pid)

    def stop(self) -> list[str]:
        """Stops every background process; the ones that did not exit cleanly, with their logs."""
        self.signal_stop()
        problems = []
        for process, log_path in self.processes:
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
        from servestack.local.hosting.processes import free_port

        self.workdir = workdir
        self.free_port: Callable[[], int] = free_port
        self.fixtures: dict[str, Fixture] = {}
        self.failed: dict[str, str] = {}  # fixture -> the block that failed first: later blocks depend on it

    def fixture(self, name: str) -> Fixture:
        """The fixture, made on first use. The repo's local up is launched then and waited for by the blocks
        that need it, so it starts while the blocks before them run."""
        if name not in self.fixtures:
            folder = self.workdir / name.replace("project=", "")
            folder.mkdir()
            ports = {"realtime": self.free_port(), "aws": self.free_port()}
            fixture = Fixture(name, folder, ports, clean_environment())
            self.fixtures[name] = fixture
            if name == "repo":
                copy_repository(folder)
                fixture.launch_local_up([str(folder / ".venv/bin/servestack"), "local", "up"])
        return self.fixtures[name]

    def run(self, block: Block) -> None:
        name = block.fixture
        if name in self.failed:
            pytest.fail(f"{block.where} not run: an earlier block of the {name} fixture failed ({self.failed[name]})")
        try:
            fixture = self.fixture(name)
            fixture.wait_ready()
            self._run(block, fixture)
        except BaseException:  # pytest.fail's exception included
            self.failed[name] = block.where
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
            compare_output(block, fixture)  # an output block's fixture is `repo`, the one OUTPUT_SOURCES names
            return
        text = fixture.substitute(block.text)
        if "background" in options:
            (command,) = commands(text)
            fixture.launch_local_up(shlex.split(command))
            fixture.wait_ready()
            return
        stdin: str | None = text  # as if pasted into `python -` or `bash` in the folder
        if block.language in PYTHONS and options.get("file"):
            (fixture.folder / options["file"]).write_text(text, encoding="utf-8")
            argv, stdin = [str(VENV_BIN / "python"), options["file"]], None
        elif block.language in PYTHONS:
            argv = [str(VENV_BIN / "python"), "-"]
        else:
            argv = ["bash", "-e", "-o", "pipefail", "-s"]
        timeout = int(options.get("timeout") or DEFAULT_TIMEOUT_SEC)
        try:
            done = subprocess.run(
                argv,
                cwd=fixture.folder,
                env=fixture.env,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as hung:
            pytest.fail(f"{block.where}: still running after {timeout}s:\n{text}\n{hung.stdout}\n{fixture.log_tail()}")
        outputs = self.workdir / "outputs"  # kept for whoever checks a block's comments against its output
        outputs.mkdir(exist_ok=True)
        (outputs / f"{block.where.replace('/', '-')}.txt").write_text(f"$ {text}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, (
            f"{block.where}: exit {done.returncode} in {fixture.folder}\n--- block as run:\n{text}"
            f"--- stdout:\n{done.stdout[-4000:]}\n--- stderr:\n{done.stderr[-4000:]}\n{fixture.log_tail()}"
        )
        if block.language in SHELLS:
            for command in commands(text):
                rehearsal = faulty_rehearsal(command)
                if rehearsal is not None:
                    check_faulty_rehearsal(rehearsal, fixture.folder)

    def stop(self) -> list[str]:
        for fixture in self.fixtures.values():  # all at once: each local up takes seconds to wind down
            fixture.signal_stop()
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
    """The blocks the suite runs (runnable and file blocks, outputs it can compare): each fixture's in document
    order, the repo fixture's last, so that its local up starts while the projects' blocks run."""
    chosen = [b for b in blocks if b.kind in ("runnable", "file") or (b.kind == "output" and compared(b))]
    return sorted(chosen, key=lambda block: block.fixture == "repo")  # stable: document order within each


def compared(block: Block) -> bool:
    return block.marker is not None and block.marker.text.removeprefix("of ") in OUTPUT_SOURCES


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


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    # GIVEN the docs site's pages and mkdocs.yml's nav (`mkdocs build --strict`, in `make test`, refuses the same;
    # this says it without a build)
    pages = sorted(path.name for path in (REPO_ROOT / "docs").glob("*.md"))
    nav = nav_pages()
    # THEN each page is reachable from the nav, once, and the nav names no missing page
    assert sorted(set(pages) - set(nav)) == [], "pages not in mkdocs.yml's nav"
    assert sorted(set(nav) - set(pages)) == [], "nav entries with no page under docs/"
    assert len(nav) == len(set(nav)), "a page is in the nav twice"


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def test_the_readmes_links_reach_files_of_the_repository() -> None:
    # GIVEN README.md's relative links (mkdocs checks the pages' links; the README is outside the site)
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    targets = [found["target"] for found in LINK.finditer(readme) if "://" not in found["target"]]
    # THEN each names a file of the repository, and every docs page it links is in the nav
    assert len(targets) >= 10  # the README's map of the docs
    missing = [target for target in targets if not (REPO_ROOT / target.split("#")[0]).is_file()]
    assert missing == []
    nav = set(nav_pages())
    assert [t for t in targets if t.startswith("docs/") and t.removeprefix("docs/").split("#")[0] not in nav] == []


def test_the_readme_stays_a_ten_minute_read_that_starts_with_the_two_commands() -> None:
    # GIVEN README.md (the rest of the docs is the site under docs/)
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    first = parse_blocks(readme, "README.md")[0]
    # THEN it is short, and its first block is `make local` then `make test`
    assert len(readme.splitlines()) <= 200, "README.md past 200 lines: move the detail to a docs page"
    assert [line.split("#")[0].strip() for line in first.text.splitlines()[:2]] == ["make local", "make test"]


def test_the_docs_rehearse_a_faulty_green_at_timings_where_the_alarm_stops_it_before_full_shift() -> None:
    # GIVEN the docs' release rehearsals that inject faults
    rehearsals = [
        (block.where, options)
        for block in all_blocks()
        if block.language in SHELLS
        for options in map(faulty_rehearsal, commands(block.text))
        if options is not None
    ]
    # THEN there is one, run by this suite (which then checks its outcome: rolled back, never at 100%)
    assert rehearsals, "no documented rehearsal shows an alarm stopping a faulty green"
    for where, options in rehearsals:
        # AND its canary lasts longer than the alarm needs: evaluation_periods complete periods, and one to spare
        interval, period = float(options["--interval-sec"]), float(options["--period-sec"])
        periods = int(options["--evaluation-periods"])
        assert interval >= (periods + 1) * period, f"{where}: a {interval} s interval, {periods} x {period} s periods"


def test_faulty_rehearsal_options_are_read_as_typed() -> None:
    # GIVEN a documented rehearsal command as commands() returns it, with its `|| test` tail
    (command,) = commands(
        "servestack local deploy iris-realtime --version 2 --inject-faults error_rate=0.5 \\\n"
        "  --interval-sec=10 --period-sec 2 || test $? -eq 1   # 1: rolled back\n"
    )
    # WHEN its options are read
    options = faulty_rehearsal(command)
    # THEN each is there, in either form, and a rehearsal without faults is none
    assert options is not None
    assert (options["name"], options["--inject-faults"], options["--interval-sec"], options["--period-sec"]) == (
        "iris-realtime",
        "error_rate=0.5",
        "10",
        "2",
    )
    assert faulty_rehearsal("servestack local deploy iris-realtime --version 2 --interval-sec 10") is None


def test_a_projects_blocks_run_in_nav_order_across_pages(tmp_path: Path) -> None:
    # GIVEN a project whose blocks span two pages, the later page first in the alphabet but second in the nav
    (tmp_path / "docs").mkdir()
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - Start: zeta.md\n  - Then:\n      - More: alpha.md\n")
    (tmp_path / "docs" / "zeta.md").write_text("<!-- runnable: project=p -->\n```bash\ntouch serving.yaml\n```\n")
    (tmp_path / "docs" / "alpha.md").write_text("<!-- runnable: project=p -->\n```bash\nls serving.yaml\n```\n")
    # WHEN the blocks are collected
    blocks = executed(all_blocks(tmp_path))
    # THEN they run in the nav's order
    assert [block.document for block in blocks] == ["docs/zeta.md", "docs/alpha.md"]


@pytest.mark.parametrize(
    ("markdown", "problem"),
    [
        ("```\nmake local\n```\n", "needs a marker"),
        ("```console\n$ ls\n```\n", "needs a marker"),
        ("<!-- cloud-only -->\n```bash\nx\n```\n", "needs a reason"),
        ("<!-- not-run:   -->\n```bash\nx\n```\n", "needs a reason"),
        ("<!-- tested: tests/e2e/test_nothing_here.py -->\n```bash\nx\n```\n", "no test module reading doc.md"),
        ("<!-- tested: tests/e2e/conftest.py -->\n```bash\nx\n```\n", "no test module reading doc.md"),
        ("<!-- runnable: projcet=iris -->\n```bash\nx\n```\n", "'projcet' is not an option of runnable"),
        ("<!-- runnable: repo, project=iris -->\n```bash\nx\n```\n", "two fixtures"),
        ("<!-- runnable -->\n\n```bash\nx\n```\n", "right above a block's fence"),
        ("<!-- runnable: project=a, background -->\n```bash\nservestack local up\nls\n```\n", "one shell command"),
        ("<!-- runnable: project=a, background -->\n```bash\nsleep 9\n```\n", "servestack local up [...]"),
        ("<!-- runnable: project=My Project -->\n```bash\nx\n```\n", "a project is named in lower case"),
        ("<!-- runnable: timeout=soon -->\n```bash\nx\n```\n", "a number of seconds"),
        ("<!-- runnable -->\n```yaml\na: 1\n```\n", "only shell and Python blocks are runnable"),
        ("<!-- file: project=a -->\n```yaml\na: 1\n```\n", "needs the file's path first"),
        ("<!-- file: serving.yaml -->\n```yaml\nmodels: []\n```\n", "not valid"),
        ("```yaml\nmodels: [\n```\n", "not valid"),
        ("```yaml\nmodels: []\ndeployments: {a: {mode: realtime, model: a, workers: 2}}\n```\n", "not valid"),
        ('```json\n{"a": }\n```\n', "not valid"),
        ("```bash\nls\n", "never closed"),
    ],
)
def test_the_convention_refuses_what_it_cannot_run_or_check(markdown: str, problem: str) -> None:
    # GIVEN a Markdown text with one mistake
    # WHEN its blocks are parsed and checked
    # THEN the mistake is named
    with pytest.raises(DocError, match=re.escape(problem)):
        checked(markdown)


def test_blocks_in_list_items_and_long_fences_keep_their_marker_and_code() -> None:
    # GIVEN a marked block indented in a list item, and a four-backtick block that shows a fence
    markdown = (
        "- item\n"
        "  <!-- runnable: project=iris, timeout=60; a note -->\n"
        "  ```bash\n"
        "  servestack invoke iris-api \\\n"
        "    --data rows.json  # the CLI\n"
        "  ```\n"
        "<!-- output -->\n"
        "````\n"
        "```bash\n"
        "````\n"
    )
    # WHEN it is parsed
    first, second = parse_blocks(markdown, "doc.md")
    # THEN the first is runnable in the iris project, dedented, one command
    assert (first.kind, first.fixture, first.options["timeout"], first.line) == ("runnable", "project=iris", "60", 3)
    assert first.text == "servestack invoke iris-api \\\n  --data rows.json  # the CLI\n"
    assert commands(first.text) == ["servestack invoke iris-api --data rows.json"]
    # AND the second holds the inner fence as text
    assert (second.kind, second.text) == ("output", "```bash\n")


@pytest.fixture(scope="module")
def docs_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsRun]:
    run = DocsRun(tmp_path_factory.mktemp("docs"))
    if any(block.fixture == "repo" for block in _blocks_or_nothing()):
        run.fixture("repo")  # its local up starts now, beside the first blocks
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
