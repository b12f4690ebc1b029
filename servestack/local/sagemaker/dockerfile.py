"""A container image as local mode runs it without Docker: its Dockerfile read, its build context's files
copied as the Dockerfile's `COPY`s place them (minus the context's `.dockerignore`), and its `ENV`, `WORKDIR`,
`ENTRYPOINT` and `CMD` turned into a process's environment, working directory and command.

What a process cannot do is said, not hidden (`Image.approximations`): `FROM`'s base image and `RUN`'s
installs are this machine's interpreter and packages (the developer's venv stands for the image's), `USER`
is the developer's own user, and the code `RUN pip install .` would install is imported from `WORKDIR`
(`PYTHONPATH`). Instructions the images here do not use are refused by name, so a new one is a loud failure
and not a silently different container.

Syntax followed: the Dockerfile reference (line continuations, `#` comments, exec (JSON) and shell forms,
`ENV k=v ...` and the legacy `ENV k v`, `$VAR`/`${VAR}` in ENV, WORKDIR and COPY) and the `.dockerignore`
reference (Go `filepath.Match` patterns plus `**`, `!` exceptions, the last matching line wins).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

SUPPORTED = ("FROM", "LABEL", "ENV", "RUN", "WORKDIR", "COPY", "EXPOSE", "USER", "ENTRYPOINT", "CMD")
# Instructions that change nothing a process sees.
_INFORMATIONAL = ("LABEL", "EXPOSE")


class DockerfileError(ValueError):
    """A Dockerfile (or .dockerignore) local mode cannot run faithfully; the message names the line."""


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]  # relative to the build context
    destination: str  # absolute, in the image
    line: int


@dataclass
class Image:
    """What a Dockerfile makes of its context, as far as a process is concerned."""

    base: str = ""
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str | None = None
    copies: list[Copy] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    # The requirement files RUN `pip install -r FILE` (or `uv pip install -r FILE`) installs, absolute in the
    # image (relative ones read from the WORKDIR of their RUN): local mode installs the same into an
    # environment of the image's own (servestack/local/hosting/environments.py).
    requirement_files: list[str] = field(default_factory=list)

    def command(self, arguments: tuple[str, ...] | None = None) -> tuple[str, ...]:
        """`docker run IMAGE ARGUMENTS...`: the ENTRYPOINT followed by the arguments, or by CMD without any."""
        return (*self.entrypoint, *(self.cmd if arguments is None else arguments))

    def approximations(self) -> list[str]:
        """What a process on this machine does differently from the container."""
        found = []
        if self.base:
            found.append(f"FROM {self.base}: the base image's system packages are this machine's")
        for run in self.runs:
            if self.requirement_files:
                what = "its pip installs of " + ", ".join(self.requirement_files) + " are an environment of the"
                found.append(f"RUN {_short(run)}: {what} image's own, built for this machine's Python")
            else:
                found.append(f"RUN {_short(run)}: not run; the packages it installs are the developer's venv")
        if self.runs:
            found.append(f"the code installed from the context is imported from WORKDIR {self.workdir} (PYTHONPATH)")
        if self.user is not None:
            found.append(f"USER {self.user}: the process runs as the developer's user")
        return found


def _requirement_files(command: str, workdir: str) -> list[str]:
    """The `-r FILE` of each `pip install` in a RUN's shell command, absolute in the image."""
    found: list[str] = []
    for part in re.split(r"&&|;|\|\|", command):
        words = shlex.split(part, comments=True)
        if "pip" not in words or "install" not in words:
            continue
        for flag, value in itertools.pairwise(words):
            if flag in ("-r", "--requirement"):
                found.append(str(PurePosixPath(workdir) / value))
    return found


def image_requirements(image: Image, root: Path) -> str | None:
    """What the image's RUN steps install, read from its staged files (`root`), as one requirements text; None
    when it installs none that way."""
    if not image.requirement_files:
        return None
    texts = []
    for path in image.requirement_files:
        staged = root / path.lstrip("/")
        if not staged.is_file():
            raise DockerfileError(f"RUN installs {path}, which no COPY of the Dockerfile puts in the image")
        texts.append(staged.read_text(encoding="utf-8"))
    return "\n".join(texts)


def _short(text: str, limit: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------ reading


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, instruction) with continuations joined and comment lines dropped."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # comments (also inside a continuation) and blank lines
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        yield start, " ".join(part.strip() for part in pending if part.strip())
        pending = []
    if pending:
        yield start, " ".join(pending)


_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _expand(value: str, env: Mapping[str, str]) -> str:
    return _VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)


def _exec_or_shell(arguments: str) -> tuple[str, ...]:
    if arguments.startswith("["):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed):
            return tuple(parsed)
    return ("/bin/sh", "-c", arguments)


def _env_pairs(arguments: str, env: Mapping[str, str], where: str) -> dict[str, str]:
    words = shlex.split(arguments)
    if words and "=" not in words[0]:  # legacy form: ENV KEY the rest of the line
        key, _, value = arguments.partition(" ")
        return {key: _expand(value.strip(), env)}
    pairs: dict[str, str] = {}
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or not key:
            raise DockerfileError(f"{where}: ENV expects KEY=VALUE pairs, got {word!r}")
        pairs[key] = _expand(value, {**env, **pairs})
    return pairs


def parse(text: str, *, name: str = "Dockerfile", base_env: Mapping[str, str] | None = None) -> Image:
    """The image a Dockerfile describes. `base_env` stands for the base image's environment (`$PATH` in an
    `ENV PATH=...:$PATH` expands to it)."""
    image = Image()
    scope = dict(base_env or {})
    stages = 0
    for line, instruction in _logical_lines(text):
        keyword, _, arguments = instruction.partition(" ")
        keyword, arguments = keyword.upper(), arguments.strip()
        where = f"{name}:{line}"
        if keyword not in SUPPORTED:
            raise DockerfileError(
                f"{where}: {keyword} is not read by local mode (it reads {', '.join(SUPPORTED)}); "
                "run this image with Docker, or extend servestack/local/sagemaker/dockerfile.py"
            )
        if keyword == "FROM":
            stages += 1
            if stages > 1:
                raise DockerfileError(f"{where}: multi-stage builds are not read by local mode (a second FROM)")
            image.base = arguments.split()[0] if arguments else ""
        elif keyword == "ENV":
            pairs = _env_pairs(arguments, scope, where)
            image.env.update(pairs)
            scope.update(pairs)
        elif keyword == "WORKDIR":
            path = _expand(arguments, scope)
            image.workdir = str(PurePosixPath(image.workdir) / path)
        elif keyword == "COPY":
            image.copies.append(_copy(arguments, scope, image.workdir, where, line))
        elif keyword == "RUN":
            image.runs.append(arguments)
            image.requirement_files += _requirement_files(arguments, image.workdir)
        elif keyword == "USER":
            image.user = arguments
        elif keyword == "ENTRYPOINT":
            image.entrypoint = _exec_or_shell(arguments)
            image.cmd = ()  # Docker: setting ENTRYPOINT resets a CMD inherited or set before it
        elif keyword == "CMD":
            image.cmd = _exec_or_shell(arguments)
    if stages == 0:
        raise DockerfileError(f"{name}: no FROM instruction")
    return image


def _copy(arguments: str, env: Mapping[str, str], workdir: str, where: str, line: int) -> Copy:
    flags = re.match(r"(?:--\S+\s+)*", arguments)
    rest = arguments[flags.end() :] if flags else arguments
    for flag in flags.group(0).split() if flags else []:
        if flag.startswith("--from"):
            raise DockerfileError(f"{where}: COPY {flag} copies from another image or stage; local mode cannot")
        if not flag.startswith(("--chown", "--chmod", "--link")):
            raise DockerfileError(f"{where}: COPY {flag} is not read by local mode (--chown, --chmod, --link are)")
    if rest.startswith("["):  # exec form: a JSON array, for paths with spaces
        try:
            words = json.loads(rest)
        except ValueError:
            raise DockerfileError(f"{where}: COPY's JSON form is not a JSON array of strings: {rest}") from None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise DockerfileError(f"{where}: COPY's JSON form is not a JSON array of strings: {rest}")
    else:
        words = shlex.split(rest)
    paths = [_expand(w, env) for w in words]
    if len(paths) < 2:
        raise DockerfileError(f"{where}: COPY needs at least one source and a destination")
    destination = paths[-1]
    absolute = str(PurePosixPath(workdir) / destination)
    if destination.endswith("/") or destination in (".", "./"):
        absolute = absolute.rstrip("/") + "/"
    return Copy(tuple(paths[:-1]), absolute, line)


# ------------------------------------------------------------------------------------------ .dockerignore


@dataclass(frozen=True)
class IgnoreRules:
    """A build context's `.dockerignore`: whether a context path is sent to the builder."""

    rules: tuple[tuple[re.Pattern[str], bool], ...] = ()  # (pattern, excludes: False for `!` lines)

    @classmethod
    def read(cls, context: Path) -> IgnoreRules:
        path = context / ".dockerignore"
        return cls.parse(path.read_text(encoding="utf-8")) if path.is_file() else cls()

    @classmethod
    def parse(cls, text: str) -> IgnoreRules:
        rules = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            excludes = not line.startswith("!")
            pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
            rules.append((re.compile(_pattern_regex(pattern)), excludes))
        return cls(tuple(rules))

    def excluded(self, relative: str) -> bool:
        """Whether `relative` (a context path) is excluded: by itself or by a directory above it."""
        parts = PurePosixPath(relative).parts
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        verdict = False
        for regex, excludes in self.rules:
            if any(regex.fullmatch(candidate) for candidate in candidates):
                verdict = excludes
        return verdict


def _pattern_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            if pattern.startswith("/", i):
                out.append("/?")  # `**/x` matches `x` at the top as well
                i += 1
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", i)
            if end < 0:
                raise DockerfileError(f".dockerignore: unclosed [ in {pattern!r}")
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            i = end + 1
            continue
        elif char == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


# ------------------------------------------------------------------------------------------ the file system


def _sources(context: Path, source: str, ignore: IgnoreRules, where: str) -> Iterator[tuple[str, Path, bool]]:
    """(path relative to the source's own root, file, source is a directory) for each file a COPY source sends."""
    pattern = os.path.normpath(source).lstrip("/")
    matched = sorted(context.glob(pattern)) if any(c in pattern for c in "*?[") else [context / pattern]
    matched = [m for m in matched if m.exists() and not ignore.excluded(m.relative_to(context).as_posix())]
    if not matched:
        raise DockerfileError(f"{where}: COPY {source}: not found in the build context (or excluded by .dockerignore)")
    for item in matched:
        if item.is_file():
            yield item.name, item, False
            continue
        for dirpath, dirnames, filenames in os.walk(item):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if not ignore.excluded((here / d).relative_to(context).as_posix()))
            for filename in sorted(filenames):
                path = here / filename
                if not ignore.excluded(path.relative_to(context).as_posix()):
                    yield path.relative_to(item).as_posix(), path, True


def stage_root(image: Image, context: Path, root: Path) -> Path:
    """The image's files, as its COPYs place them, under `root` (built once: a finished root is reused; the
    caller names it after the context's content, e.g. the asset hash). Returns `root`."""
    if (root / ".staged").is_file():
        return root
    ignore = IgnoreRules.read(context)
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root.parent))
    for copy in image.copies:
        where = f"COPY at line {copy.line}"
        into_directory = copy.destination.endswith("/") or len(copy.sources) > 1
        for source in copy.sources:
            for relative, path, from_directory in _sources(context, source, ignore, where):
                if from_directory or into_directory:
                    target = partial / copy.destination.lstrip("/") / relative
                else:
                    target = partial / copy.destination.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)  # with its mode: scripts stay executable
    (partial / image.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)  # Docker creates a missing WORKDIR
    (partial / ".staged").touch()
    if root.exists():
        shutil.rmtree(root)
    try:
        partial.rename(root)
    except OSError:  # staged meanwhile by another local up: same content
        shutil.rmtree(partial, ignore_errors=True)
    return root


# ------------------------------------------------------------------------------------------ the process


@dataclass(frozen=True)
class ContainerCommand:
    """How to start the image's container as a process here."""

    argv: tuple[str, ...]
    cwd: Path
    environment: dict[str, str]  # the image's ENV, paths mapped; the model's Environment goes on top


def container_command(
    image: Image, root: Path, arguments: tuple[str, ...] | None, *, venv: str | None = None
) -> ContainerCommand:
    """The process for `docker run IMAGE ARGUMENTS` with the image's files under `root`. The image's virtual
    environment (`VIRTUAL_ENV`) stands for `venv` (default: this interpreter's), other image paths are
    under `root`; the program is looked up on the image's PATH as mapped."""
    venv = venv or sys.prefix
    image_venv = image.env.get("VIRTUAL_ENV")

    def local(path: str) -> str:
        if image_venv and (path == image_venv or path.startswith(image_venv.rstrip("/") + "/")):
            return venv + path[len(image_venv.rstrip("/")) :]
        if path.startswith("/") and (root / path.lstrip("/")).exists():
            return str(root / path.lstrip("/"))
        return path

    env = {}
    for key, value in image.env.items():
        if key == "PATH":
            env[key] = os.pathsep.join(local(entry) for entry in value.split(os.pathsep))
        elif value.startswith("/"):
            env[key] = local(value)
        else:
            env[key] = value
    workdir = root / image.workdir.lstrip("/")
    # RUN `pip install .` puts the context's packages into the image's venv; here they are imported from WORKDIR.
    env["PYTHONPATH"] = str(workdir)
    argv = list(image.command(arguments))
    if not argv:
        raise DockerfileError("the image has no ENTRYPOINT or CMD and no command was given")
    if not argv[0].startswith("/"):
        found = shutil.which(argv[0], path=env.get("PATH", os.environ.get("PATH", "")))
        if found is None:
            raise DockerfileError(f"{argv[0]}: the image's command is not on its PATH here ({env.get('PATH', '')})")
        argv[0] = found
    else:
        argv[0] = local(argv[0])
    return ContainerCommand(tuple(argv), workdir, env)
