"""The `servestack` commands that act on a running `local up`: invoke, run-batch, deploy, and its lifecycle
(detach, status, down).

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from servestack.local.commands import lifecycle

__all__ = ["lifecycle"]
