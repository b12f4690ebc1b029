"""The `servestack` commands that act on a running `local up`: invoke, run-batch, deploy, and its lifecycle
(detach, status, down).

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.commands import lifecycle
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = ["lifecycle"]
