"""moto's server with IAM in front: what `ThreadedMotoServer` serves, wrapped by `IamEnforcer.wsgi`.

moto's `ThreadedMotoServer` builds its WSGI app internally, so it cannot take a middleware. This does what its
`_server_entry` does (moto/moto_server/threaded_moto_server.py: `DomainDispatcherApplication(create_backend_app)`
served by werkzeug's threaded server with `MotoRequestHandler`), with the enforcer around the app.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from servestack.local.hosting import listening_port
from servestack.local.iam.enforcer import IamEnforcer


class EnforcedMotoServer:
    """An in-process moto server over HTTP whose every request goes through `enforcer` first."""

    def __init__(self, enforcer: IamEnforcer, *, host: str = "127.0.0.1", port: int = 0) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self.enforcer = enforcer
        app = enforcer.wsgi(DomainDispatcherApplication(create_backend_app))
        self._server: Any = make_server(
            host, listening_port(port, host), app, threaded=True, request_handler=MotoRequestHandler
        )
        self.host, self.port = str(self._server.server_address[0]), int(self._server.server_address[1])
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-iam", daemon=True)

    def start(self) -> EnforcedMotoServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
