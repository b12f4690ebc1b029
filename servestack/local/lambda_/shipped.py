"""A local Lambda execution environment imports what the function ships, and what Lambda's runtime provides.

In AWS a function's modules come from its bundle (/var/task: its handler and the packages bundled with it) and
from the Python runtime (the standard library, and the AWS SDK: boto3 and what it needs). A module that is
neither fails with "No module named ..." at init. Local mode runs the function with its code asset first on
the path and the bundle's packages, installed for this machine (servestack/local/hosting/environments.py),
second; `ShippedOnly` then refuses any other top-level module that would otherwise come from the developer's
virtual environment, so a hook that imports a package its deployment does not ship fails here as it would
there, with the error saying how to ship it.

servestack itself is imported before the function's code, from the installation whose runtime files the code
asset carries a copy of.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

# What Lambda's Python runtime provides besides the standard library (its documented boto3 and botocore, and
# their dependencies), and what this runner itself needs loaded.
RUNTIME_PROVIDED = frozenset(
    {"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3", "awslambdaric", "_distutils_hack"}
)


class ShippedOnly(importlib.abc.MetaPathFinder):
    """Refuses a top-level module that neither the code asset and its packages (`shipped`) nor the runtime
    (standard library, RUNTIME_PROVIDED) holds."""

    def __init__(self, shipped: Sequence[str]) -> None:
        self.shipped = list(shipped)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if "." in fullname or fullname in sys.modules:
            return None  # a submodule follows its package; a loaded module is the runtime's or servestack's
        if fullname in sys.stdlib_module_names or fullname in RUNTIME_PROVIDED or fullname in sys.builtin_module_names:
            return None
        if importlib.machinery.PathFinder.find_spec(fullname, self.shipped) is not None:
            return None  # the normal import finds it there first: the shipped folders lead sys.path
        raise ModuleNotFoundError(
            f"No module named '{fullname}' (the function's bundle does not ship it: its requirements.txt lists "
            "what it does)",
            name=fullname,
        )


def isolate(task_root: str, packages: str | None) -> None:
    """Put the code asset and its packages first on the path and refuse what neither they nor the runtime hold."""
    shipped = [task_root, *([packages] if packages else [])]
    sys.path[:0] = [p for p in shipped if p not in sys.path]
    sys.meta_path.insert(0, ShippedOnly(shipped))
