"""The Dockerfile reader local mode runs images with (servestack/local/sagemaker/dockerfile.py): the repository's own
Dockerfiles as they are, the syntax they use, `.dockerignore` as Docker reads it, loud refusals of what it
does not read, and one container run from a staged context."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servestack.local.sagemaker.dockerfile import DockerfileError, IgnoreRules, container_command, parse, stage_root
from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("name", ["cpu.Dockerfile", "gpu.Dockerfile"])
def test_the_repositorys_dockerfiles_read_as_their_images(name: str) -> None:
    image = parse(
        (REPO_ROOT / "servestack" / "cdk" / "containers" / name).read_text(),
        name=name,
        base_env={"PATH": "/usr/bin:/bin"},
    )
    assert image.workdir == "/opt/program"
    entry = ("python", "-m", "handlers.realtime")  # the project's entry points, staged into every context
    assert image.command(("serve",)) == (*entry, "serve")  # `docker run IMAGE serve`, as SageMaker runs it
    assert image.command() == (*entry, "serve")  # CMD after ENTRYPOINT
    assert image.env["PATH"] == "/opt/venv/bin:/usr/bin:/bin"  # $PATH is the base image's
    assert image.env["VIRTUAL_ENV"] == "/opt/venv"
    assert image.env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert image.user == "1000"
    assert image.env["PYTHONPATH"] == "/opt/program"
    # What servestack/cdk/images.py stages: the locked runtime, servestack's runtime, the entry points, packages
    assert [(c.sources, c.destination) for c in image.copies] == [
        (("requirements.txt",), "/opt/program/"),
        (("servestack",), "/opt/program/servestack"),
        (("handlers",), "/opt/program/handlers"),
        (("models",), "/opt/program/models"),
    ]
    said = "\n".join(image.approximations())
    assert f"FROM {image.base}" in said
    assert "USER 1000" in said
    assert "RUN " in said


def test_env_forms_expansion_and_relative_workdirs() -> None:
    image = parse(
        'FROM scratch\nENV A=1 B="two words" \\\n    C=${A}-$B\nENV LEGACY value with spaces\n'
        "WORKDIR /srv\nWORKDIR app\nCMD python -m x\n# a comment\n"
    )
    assert image.env == {"A": "1", "B": "two words", "C": "1-two words", "LEGACY": "value with spaces"}
    assert image.workdir == "/srv/app"
    assert image.command() == ("/bin/sh", "-c", "python -m x")  # shell form
    assert parse('FROM x\nCMD ["a"]\nENTRYPOINT ["b"]\n').command() == ("b",)  # ENTRYPOINT resets CMD
    copies = parse('FROM x\nWORKDIR /w\nCOPY --chown=1000 ["a b.txt", "c"]\nCOPY --link d e/ ./\n').copies
    assert [(c.sources, c.destination) for c in copies] == [(("a b.txt",), "/w/c"), (("d", "e/"), "/w/")]


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("FROM x\nHEALTHCHECK CMD true\n", "Dockerfile:2: HEALTHCHECK is not read by local mode"),
        ("FROM x\nADD https://example.com/f /f\n", "Dockerfile:2: ADD is not read by local mode"),
        ("FROM x AS build\nFROM y\n", "Dockerfile:2: multi-stage builds are not read"),
        ("FROM x\nCOPY --from=build /a /b\n", "COPY --from=build copies from another image or stage"),
        ("COPY a b\n", "Dockerfile: no FROM instruction"),
        ("FROM x\nCOPY a\n", "COPY needs at least one source and a destination"),
        ('FROM x\nCOPY ["a", 1]\n', "COPY's JSON form is not a JSON array of strings"),
        ("FROM x\nCOPY --parents a b\n", "COPY --parents is not read by local mode"),
    ],
)
def test_what_local_mode_cannot_run_is_refused_by_name(text: str, refusal: str) -> None:
    with pytest.raises(DockerfileError, match=refusal.replace("(", r"\(")):
        parse(text)


def test_dockerignore_patterns_exceptions_and_directories() -> None:
    rules = IgnoreRules.parse("# caches\n**/__pycache__\ntests\n*.md\n!KEEP.md\n/build/*.o\n")
    assert rules.excluded("handlers/__pycache__/x.pyc")
    assert rules.excluded("__pycache__/x.pyc")  # `**/` matches at the top too
    assert rules.excluded("tests/unit/test_x.py")  # under an excluded directory
    assert rules.excluded("README.md")
    assert not rules.excluded("KEEP.md")  # the last matching line wins
    assert not rules.excluded("docs/guide.md")  # `*` does not cross `/`
    assert rules.excluded("build/a.o")
    assert not rules.excluded("build/a.c")
    assert not rules.excluded("servestack/adapters/realtime.py")


def make_context(root: Path) -> Path:
    context = root / "context"
    (context / "app" / "__pycache__").mkdir(parents=True)
    (context / "app" / "__main__.py").write_text(
        "import json, os, pathlib\n"
        "print(json.dumps({'cwd': os.getcwd(), 'greeting': os.environ['GREETING'], "
        "'config': pathlib.Path('conf/settings.txt').read_text(), 'files': sorted(os.listdir('.')), "
        "'module': __import__('app').__file__}))\n"
    )
    (context / "app" / "__init__.py").write_text("")
    (context / "app" / "__pycache__" / "stale.pyc").write_bytes(b"\0")
    (context / "app" / "secret.txt").write_text("not for the image")
    (context / "settings.txt").write_text("from the context")
    (context / "unused.txt").write_text("never copied")
    (context / ".dockerignore").write_text("**/__pycache__\napp/secret.txt\n")
    (context / "Dockerfile").write_text(
        "FROM python:3.12-slim\n"
        "ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH GREETING=hello\n"
        "WORKDIR /srv\n"
        "COPY app ./app\n"
        "COPY settings.txt conf/\n"
        'ENTRYPOINT ["python", "-m", "app"]\n'
    )
    return context


def test_a_container_runs_from_its_staged_context(tmp_path: Path) -> None:
    # GIVEN a build context with a .dockerignore, and its Dockerfile
    context = make_context(tmp_path)
    image = parse((context / "Dockerfile").read_text(), base_env={"PATH": "/usr/bin:/bin"})
    # WHEN its files are staged as its COPYs place them and its command is built
    root = stage_root(image, context, tmp_path / "images" / "abc" / "rootfs")
    command = container_command(image, root, None)
    # THEN only what the COPYs take, minus the excluded files, is in the image
    staged = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert staged == [".staged", "srv/app/__init__.py", "srv/app/__main__.py", "srv/conf/settings.txt"]
    # AND `python` is the image venv's, which stands for this interpreter's environment
    assert command.argv[0] == str(Path(sys.prefix) / "bin" / "python")
    assert command.environment["VIRTUAL_ENV"] == sys.prefix
    # AND the process runs in WORKDIR with the image's ENV, importing the staged code
    ran = subprocess.run(command.argv, cwd=command.cwd, env=command.environment, capture_output=True, check=True)
    seen = json.loads(ran.stdout)
    assert seen["cwd"] == str(root / "srv")
    assert seen["greeting"] == "hello"
    assert seen["config"] == "from the context"
    assert seen["files"] == ["app", "conf"]
    assert seen["module"] == str(root / "srv" / "app" / "__init__.py")


def test_a_copy_source_missing_from_the_context_is_refused(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    image = parse("FROM x\nCOPY app/secret.txt /x\n")
    with pytest.raises(DockerfileError, match=r"COPY app/secret\.txt: not found in the build context"):
        stage_root(image, context, tmp_path / "rootfs")


def test_a_command_off_the_images_path_is_refused(tmp_path: Path) -> None:
    image = parse('FROM x\nENV PATH=/nowhere\nENTRYPOINT ["no-such-program"]\n')
    with pytest.raises(DockerfileError, match="no-such-program: the image's command is not on its PATH"):
        container_command(image, tmp_path, None)
