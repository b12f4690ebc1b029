"""`servestack local ...`: the serving topology on this machine, no Docker and no AWS.

Each package of local mode plays one AWS service, and other packages import it through its interface only: the
names its `__init__.py` imports under `if TYPE_CHECKING:` and lists in `__all__` (tests/unit/test_import_boundaries.py).
Those names are loaded on first use (`lazy_interface`), so a child process that needs one module of a package
(a Lambda execution environment, an endpoint's router, a CLI command) does not import the whole package and
everything it reaches: local up starts dozens of such processes.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path


def interface_sources(init_file: str | Path) -> dict[str, tuple[str, str]]:
    """Each name a package's `__init__.py` imports under `if TYPE_CHECKING:` -> (module, name in that module)."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    found: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0:
                    for alias in statement.names:
                        found[alias.asname or alias.name] = (statement.module, alias.name)
    return found


def lazy_interface(package: str, init_file: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` (PEP 562) that load `package`'s interface on first use."""
    sources = interface_sources(init_file)

    def load(name: str) -> object:
        try:
            module, attribute = sources[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        if module == package:  # `from servestack.local.batch import data`: a submodule
            value: object = importlib.import_module(f"{package}.{attribute}")
        else:
            value = getattr(importlib.import_module(module), attribute)
        setattr(sys.modules[package], name, value)  # the next lookup is a plain attribute
        return value

    def names() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(sources))

    return load, names
