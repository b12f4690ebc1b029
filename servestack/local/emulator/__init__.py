"""The AWS endpoint `local up` talks to: the embedded moto server, its state across restarts, the state file
other commands read, and calls made as one of its principals.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.emulator import state
    from servestack.local.emulator.callers import control, developer, sagemaker_runtime, signed
    from servestack.local.emulator.moto_server import EmbeddedEmulator, client_as, clients_for, session_client
    from servestack.local.emulator.persistence import EmulatorState
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "EmbeddedEmulator",
    "EmulatorState",
    "client_as",
    "clients_for",
    "control",
    "developer",
    "sagemaker_runtime",
    "session_client",
    "signed",
    "state",
]
