"""No unused definitions in the code: every module-level function and class, and every method, of models/,
handlers/, stacks/ and servestack/ is referenced somewhere in the repository (tests, benchmarks, scripts and
docs included).

vulture is not a dependency, so this is a small version of what it does: `ast` finds the definitions, and a
definition counts as used when its name occurs anywhere else: in code, a string (CDK handler strings), a
comment, or a text file (entry points in pyproject.toml, Dockerfiles, the docs' executed blocks). Names are
compared as words, not resolved: a method is used when any attribute of its name is, which errs on the side
of "used" and never flags a used definition. Words, not a walk of every syntax tree, keep it well under a
second.

What a framework calls by its own convention (a base class's hook, an HTTP handler's `do_POST`) is listed in
tests/unit/unused_allowlist.txt, each with its reason; an entry that names no definition any more fails too.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.conftest import REPO_ROOT

CHECKED = ("models", "handlers", "stacks", "servestack")
SKIPPED_DIRS = {".venv", ".tools", ".bench", "node_modules", ".servestack", "cdk.out", ".git", "__pycache__",
                ".mypy_cache", ".ruff_cache", ".pytest_cache", "site", "dist", "build"}  # fmt: skip
TEXT_SUFFIXES = {".py", ".toml", ".json", ".yaml", ".yml", ".md", ".sh", ".cfg", ".ini", ".txt", ".Dockerfile"}
ALLOWLIST = Path(__file__).with_name("unused_allowlist.txt")
# Decorators that leave a function to be called by name; any other (a route, a fixture, a handler wrapper)
# registers it with something that calls it.
PLAIN_DECORATORS = {"property", "staticmethod", "classmethod", "cache", "cached_property", "lru_cache", "override",
                    "abstractmethod", "setter", "wraps", "contextmanager", "asynccontextmanager"}  # fmt: skip
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFINED = re.compile(r"(?:def|class)\s+([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Definition:
    path: str  # relative to the repository
    qualname: str  # "function", "Class" or "Class.method"
    line: int

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]


def repository_files() -> Iterator[Path]:
    for path in REPO_ROOT.rglob("*"):
        relative = path.relative_to(REPO_ROOT).parts
        if any(part in SKIPPED_DIRS for part in relative) or not path.is_file() or path == ALLOWLIST:
            continue  # the allowlist names what it allows: its words are no use
        if path.suffix in TEXT_SUFFIXES or path.name in ("Makefile", "Dockerfile") or path.name.endswith(".Dockerfile"):
            yield path


@cache
def texts() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8", errors="replace") for path in repository_files()}


def _decorator_name(decorator: ast.expr) -> str:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def _called_by_name(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    return all(_decorator_name(d) in PLAIN_DECORATORS for d in node.decorator_list)


@cache
def definitions() -> tuple[Definition, ...]:
    found = []
    for path, text in texts().items():
        relative = path.relative_to(REPO_ROOT)
        if path.suffix != ".py" or relative.parts[0] not in CHECKED:
            continue
        for node in ast.parse(text, str(path)).body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if _called_by_name(node):
                found.append(Definition(str(relative), node.name, node.lineno))
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if not isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef) or member.name.startswith("__"):
                        continue
                    if _called_by_name(member):
                        found.append(Definition(str(relative), f"{node.name}.{member.name}", member.lineno))
    return tuple(found)


@cache
def referenced_names() -> frozenset[str]:
    """Every name that occurs in the repository other than where something of that name is defined: a word of
    any file (code, strings, comments, text files) counts, less one for each `def NAME` / `class NAME`."""
    words: Counter[str] = Counter()
    defined: Counter[str] = Counter()
    for path, text in texts().items():
        words.update(WORD.findall(text))
        if path.suffix == ".py":
            defined.update(DEFINED.findall(text))
    return frozenset(name for name, count in words.items() if count > defined[name])


def allowlist() -> dict[str, str]:
    """`Qualname-pattern  reason` per line (fnmatch patterns; # starts a comment line)."""
    entries = {}
    for line in ALLOWLIST.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pattern, _, reason = line.partition(" ")
        assert reason.strip(), f"{ALLOWLIST.name}: {pattern} has no reason"
        entries[pattern] = reason.strip()
    return entries


def test_every_definition_is_referenced_somewhere() -> None:
    used, allowed = referenced_names(), allowlist()
    unused = [
        f"{d.path}:{d.line} {d.qualname}"
        for d in definitions()
        if d.name not in used and not any(fnmatch.fnmatchcase(d.qualname, p) for p in allowed)
    ]
    assert not unused, "defined but referenced nowhere (remove, or allowlist with a reason):\n" + "\n".join(unused)


def test_every_allowlist_entry_names_a_definition_that_needs_it() -> None:
    # An entry whose definition is gone, or is referenced now, only hides the next unused one of that name.
    used, every = referenced_names(), definitions()
    stale = [
        pattern
        for pattern in allowlist()
        if not any(fnmatch.fnmatchcase(d.qualname, pattern) and d.name not in used for d in every)
    ]
    assert not stale, f"{ALLOWLIST.name}: no unreferenced definition matches {stale}"
