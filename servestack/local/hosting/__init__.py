"""How `local up` hosts its fronts and children: the one HTTP stack, child processes, and restart backoff.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.hosting.environments import PackagesError, installed
    from servestack.local.hosting.http_server import (
        BODY_TIMEOUT_SEC,
        HOP_BY_HOP,
        MAX_BODY_BYTES,
        LocalHttpServer,
        Reply,
        Request,
        request_id,
    )
    from servestack.local.hosting.processes import (
        IDENTITY_VARIABLES,
        REPO_ROOT,
        GroupLeader,
        RealtimeProcess,
        die_with_parent,
        free_port,
        http_status,
        kill_group,
        listening_port,
        port_is_free,
        stop_process,
        without_identity,
    )
    from servestack.local.hosting.restarts import Backoff
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "BODY_TIMEOUT_SEC",
    "HOP_BY_HOP",
    "IDENTITY_VARIABLES",
    "MAX_BODY_BYTES",
    "REPO_ROOT",
    "Backoff",
    "GroupLeader",
    "LocalHttpServer",
    "PackagesError",
    "RealtimeProcess",
    "Reply",
    "Request",
    "die_with_parent",
    "free_port",
    "http_status",
    "installed",
    "kill_group",
    "listening_port",
    "port_is_free",
    "request_id",
    "stop_process",
    "without_identity",
]
