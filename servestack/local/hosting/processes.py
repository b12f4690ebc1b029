"""Child processes of `local up`: started, health-checked and stopped the way an orchestrator would."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[3]
# A process's AWS identity, as boto3 finds it in the environment: a child gets its own role's, never its
# parent's (issue 37: each child receives only its own role's keys).
IDENTITY_VARIABLES = frozenset({
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
})  # fmt: skip


def without_identity(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without any AWS identity (`IDENTITY_VARIABLES`)."""
    return {key: value for key, value in environ.items() if key not in IDENTITY_VARIABLES}


def die_with_parent() -> None:
    """In a child, before exec: receive SIGTERM when the parent dies (Linux), so a killed `local up` or router
    leaves no orphaned servers behind. Elsewhere, nothing."""
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


_HANDED_OUT: set[int] = set()
# Ports picked by any process of this user, until their server has surely bound them: a pick is only a
# probe (bind to port 0, close), and another process's probe, or a server of ours binding port 0, could take
# the same port before our child binds it. Every pick and every port-0 bind of local mode goes through this
# registry, so no two of our processes ever hold the same port (seen in CI: two xdist workers' `local up`s, a
# Lambda front answering a router's request to its container).
PORT_CLAIM_TTL_SEC = 300.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, claimed for this process in the user's port registry: no other process
    of ours is handed it for `PORT_CLAIM_TTL_SEC`, long enough for the child it is meant for to bind it."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT and _claim(port):
            _HANDED_OUT.add(port)
            return port
    raise OSError(f"no free port on {host}: 200 picks were all claimed by other processes")


def listening_port(port: int, host: str = "127.0.0.1") -> int:
    """The port a server of local mode binds: `port`, or for 0 a claimed `free_port` (never the kernel's own
    pick, which may be a port another process claimed but has not bound yet)."""
    return port or free_port(host)


def _claim(port: int) -> bool:
    import fcntl
    import tempfile

    registry = Path(tempfile.gettempdir()) / f"servestack-ports-{os.getuid()}"
    registry.mkdir(mode=0o700, exist_ok=True)
    with (registry / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # claims are serialized across processes; released on close
        claim = registry / str(port)
        try:
            if time.time() - claim.stat().st_mtime < PORT_CLAIM_TTL_SEC:
                return False
        except FileNotFoundError:
            pass
        claim.write_text(str(os.getpid()))
        return True


def http_status(url: str, timeout_sec: float = 2.0) -> int | None:
    """The status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_sec) as response:  # noqa: S310 - our own local URL
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, OSError):
        return None


class GroupLeader(subprocess.Popen[bytes]):
    """A child started in a session (and process group) of its own, whose id is its pid: `stop_process` and
    `kill_group` signal the whole group, so the workers a server forked go with it."""

    def __init__(self, argv: list[str], **options: Any) -> None:
        super().__init__(argv, start_new_session=True, **options)


@dataclass
class RealtimeProcess:
    """The realtime container entry (`python -m servestack.adapters.realtime serve`) as a child process."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def start(
        cls,
        name: str,
        port: int,
        *,
        env: dict[str, str] | None = None,
        workers: int = 1,
        output: IO[bytes] | int | None = None,
        argv: list[str] | None = None,
        cwd: Path | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> RealtimeProcess:
        """`argv` and `cwd`: the image's command and WORKDIR (servestack/local/sagemaker/container.py); by default the
        realtime entry from the working tree. `base_env`: the environment under `env` (default this process's)."""
        child_env = {
            **(os.environ if base_env is None else base_env),
            "SAGEMAKER_BIND_TO_PORT": str(port),
            "SERVESTACK_HOST": "127.0.0.1",
            "SERVESTACK_WORKERS": str(workers),
            **(env or {}),
        }
        process = GroupLeader(
            argv or [sys.executable, "-m", "servestack.adapters.realtime", "serve"],
            cwd=cwd or REPO_ROOT,
            env=child_env,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            preexec_fn=die_with_parent,
        )
        return cls(name, port, process)

    def wait_ready(self, timeout_sec: float = 60.0) -> None:
        """Block until `/ping` is 200; raise if the process dies or the time runs out."""
        deadline = time.monotonic() + timeout_sec
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name}: the server exited with code {self.process.returncode}")
            if http_status(f"{self.url}/ping") == 200:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: /ping not ready after {timeout_sec:.0f}s")

    def stop(self, grace_sec: float = 15.0) -> int:
        return stop_process(self.process, grace_sec)


def stop_process(process: subprocess.Popen[bytes], grace_sec: float) -> int:
    """SIGTERM (servers drain in-flight requests), then SIGKILL after the grace period; the exit code. A child
    started in a session of its own (`start_new_session=True`) is signalled as a group, and whatever of the
    group outlives it (a worker whose master died) is killed: no orphan keeps serving its port."""
    group = _own_group(process)
    if process.poll() is None:
        _signal(process, group, signal.SIGTERM)
        try:
            process.wait(timeout=grace_sec)
        except subprocess.TimeoutExpired:
            _signal(process, group, signal.SIGKILL)
            process.wait()
    kill_group(process)
    return process.returncode


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process left in the group of `process` (started with `start_new_session=True`), e.g. the
    workers of a server whose master was killed; nothing when it leads no group of its own."""
    group = _own_group(process)
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # an empty group: nothing was left
            os.killpg(group, signal.SIGKILL)


def _own_group(process: subprocess.Popen[bytes]) -> int | None:
    """The process group `process` leads (its pid, with `start_new_session=True`), else None. Read from
    how it was started, never from the pid's current group (Linux hands out no pid that is still a live group's
    id, so the group's id stays the leader's while any member is left)."""
    return process.pid if isinstance(process, GroupLeader) else None


def _signal(process: subprocess.Popen[bytes], group: int | None, signum: int) -> None:
    try:
        if group is not None:
            os.killpg(group, signum)
        else:
            process.send_signal(signum)
    except (ProcessLookupError, PermissionError):
        pass
