"""Ports picked by local mode are claimed across processes: two processes picking at once never get the same
port, and a server binding "any port" takes a claimed one, never the kernel's own pick (the CI failure where
one xdist worker's Lambda front answered another worker's router on its container's port)."""

from __future__ import annotations

import subprocess
import sys

from servestack.local.hosting import LocalHttpServer, Reply
from servestack.local.hosting.processes import REPO_ROOT, free_port

PICKS = 400
PICKER = f"from servestack.local.hosting.processes import free_port\nprint(*(free_port() for _ in range({PICKS})))"


def test_processes_picking_at_once_never_share_a_port() -> None:
    # Without the registry, 3 x 400 picks from a ~28,000-port range share ~8 ports on average (birthdays).
    pickers = [
        subprocess.Popen([sys.executable, "-c", PICKER], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    picks = [set(map(int, picker.communicate(timeout=120)[0].split())) for picker in pickers]
    assert [len(p) for p in picks] == [PICKS] * 3
    shared = (picks[0] & picks[1]) | (picks[0] & picks[2]) | (picks[1] & picks[2])
    assert not shared


def test_a_server_on_any_port_takes_no_port_claimed_elsewhere() -> None:
    claimed_elsewhere = set(
        map(int, subprocess.run([sys.executable, "-c", PICKER], cwd=REPO_ROOT, capture_output=True, text=True,
                                check=True, timeout=120).stdout.split())
    )  # fmt: skip
    ours = {free_port() for _ in range(50)}
    servers = [LocalHttpServer(f"s{i}", lambda request: Reply(200, {}, b"")) for i in range(20)]
    try:
        bound = {server.port for server in servers}
        assert len(bound) == 20
        assert not (bound | ours) & claimed_elsewhere
        assert not bound & ours
    finally:
        for server in servers:
            server.socket.close()
