"""How `servestack` commands fail: one line saying what to do, and a documented exit code.

These are the exits of the command line, not errors a server reports to a caller (those are the
`servestack/inference/errors.py` hierarchy, each with its HTTP status). `failure_of` is the one place where an exception
raised anywhere below a command becomes an exit code and a line; `servestack --debug` shows the traceback
instead. The codes are listed in `servestack --help` and in docs/cli.md.

A command that needs a package the installation lacks (the base install is the command alone: `pip install
servestack`) fails with one line naming the extra to install, exit code 7: before it runs, when a module of the
extra it declares is missing (servestack/extras.py), and when it raises `ModuleNotFoundError` for a module that
is not servestack's own all the same.
"""

from __future__ import annotations

import errno
import sys
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # the command ran, and what it ran failed (a prediction answered an error, a release rolled back)
    USAGE = 2  # bad arguments, serving.yaml, input file or model file: fix the command or the file
    NOT_RUNNING = 3  # `servestack local up` is not running, or not answering where its state file says
    NOT_FOUND = 4  # no such deployment, model, version or alias
    CONFLICT = 5  # the registry already holds that version with other bytes
    AWS = 6  # an AWS call failed: credentials, permissions, region or network
    MISSING_EXTRA = 7  # the command needs an extra that is not installed: pip install 'servestack[EXTRA]'
    BUG = 70  # an unexpected error: a bug in servestack (EX_SOFTWARE in sysexits.h)
    INTERRUPTED = 130  # Ctrl-C


EXIT_CODE_HELP = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "the command ran and its outcome is a failure (an error answer, a rollback, no 2xx, drift)",
    ExitCode.USAGE: "bad arguments, serving.yaml, input file or model file",
    ExitCode.NOT_RUNNING: "`servestack local up` is not running (or not answering)",
    ExitCode.NOT_FOUND: "no such deployment, model, version or alias",
    ExitCode.CONFLICT: "the registry holds that version with other bytes",
    ExitCode.AWS: "an AWS call failed (credentials, permissions, region, network)",
    ExitCode.MISSING_EXTRA: "the command needs an extra that is not installed: pip install 'servestack[EXTRA]'",
    ExitCode.BUG: "a bug in servestack: run again with --debug and report the traceback",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def exit_codes_text() -> str:
    return "exit codes:\n" + "\n".join(f"  {int(code):<4} {text}" for code, text in EXIT_CODE_HELP.items())


class CommandError(Exception):
    """An expected failure of a command: `message` says what went wrong and what to do about it."""

    code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, code: ExitCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class NotRunning(CommandError, FileNotFoundError):
    """No `local up` behind the state file. Also a FileNotFoundError, which is what callers caught before."""

    code = ExitCode.NOT_RUNNING


class MissingExtra(CommandError):
    """A module of the extra a command needs cannot be imported: install that extra."""

    code = ExitCode.MISSING_EXTRA

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(missing_extra_line(extra, module))
        self.extra = extra
        self.module = module


def missing_extra_line(extra: str, module: str) -> str:
    return f"needs servestack[{extra}] (missing: {module}); install it: pip install 'servestack[{extra}]'"


def failure_of(error: BaseException, extra: str | None = None) -> tuple[ExitCode, str] | None:
    """The exit code and the one line for an expected failure; None for a bug (shown with its traceback).

    `extra`: the one the failed command declares, which a `ModuleNotFoundError` names (else the smallest extra
    holding the missing module)."""
    if isinstance(error, CommandError):
        return error.code, error.message
    if isinstance(error, KeyboardInterrupt):
        return ExitCode.INTERRUPTED, "interrupted"
    found = (
        _missing_extra(error, extra)
        or _serving_error(error)
        or _spec_error(error)
        or _aws_error(error)
        or _network_error(error)
    )
    if found is not None:
        return found
    if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        return ExitCode.USAGE, f"{error.strerror}: another process took the port; pick free ones (--port, --aws-port)"
    if isinstance(error, OSError) and error.filename is not None:
        what = error.strerror or str(error)
        hint = {errno.ENOENT: "check the path", errno.EACCES: "check its permissions"}.get(error.errno or 0, "")
        return ExitCode.USAGE, f"{error.filename}: {what}" + (f"; {hint}" if hint else "")
    return None


def _missing_extra(error: BaseException, extra: str | None) -> tuple[ExitCode, str] | None:
    """A third-party module missing: the command's extra (when it declares none: the extra holding the module).
    One of servestack's own modules missing is a broken installation or a bug, not an extra to install."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    top = error.name.partition(".")[0]
    if top == "servestack":
        return None
    from servestack.extras import extra_of

    named = extra or extra_of(top)
    if named is None:  # no extra installs it: a dependency missing from pyproject.toml, a bug
        return None
    return ExitCode.MISSING_EXTRA, missing_extra_line(named, error.name)


def _serving_error(error: BaseException) -> tuple[ExitCode, str] | None:
    from servestack.inference.errors import ModelNotFound, ServingError, VersionConflict

    if not isinstance(error, ServingError):
        return None
    line = error.message + (f" (allowed: {error.allowed})" if error.allowed else "")
    if isinstance(error, ModelNotFound):
        return ExitCode.NOT_FOUND, line
    if isinstance(error, VersionConflict):
        return ExitCode.CONFLICT, line
    return ExitCode.USAGE, line


def _spec_error(error: BaseException) -> tuple[ExitCode, str] | None:
    # Not imported here: servestack.spec needs pydantic, which the base install lacks; a SpecError can only have
    # been raised once its module was imported.
    base = sys.modules.get("servestack.spec.base")
    if base is not None and isinstance(error, base.SpecError):
        return ExitCode.USAGE, str(error)  # one line per problem: each names the path, the value and the fix
    return None


def _aws_error(error: BaseException) -> tuple[ExitCode, str] | None:
    if "botocore" not in sys.modules:  # never imported (or not installed): nothing of botocore can have been raised
        return None
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
    )

    if isinstance(error, NoCredentialsError):
        return ExitCode.AWS, "no AWS credentials found: run `aws configure`, or set AWS_PROFILE or AWS_ACCESS_KEY_ID"
    if isinstance(error, NoRegionError):
        return ExitCode.AWS, "no AWS region: pass --region, or set AWS_REGION"
    if isinstance(error, EndpointConnectionError):
        url = str(error.kwargs.get("endpoint_url", ""))
        if "://127.0.0.1" in url or "://localhost" in url:  # the emulator of a local up that is gone
            return ExitCode.NOT_RUNNING, f"{error}: is `servestack local up` still running? (start it again)"
        return ExitCode.AWS, f"{error}: check the region and the network (or --endpoint-url)"
    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        return ExitCode.AWS, f"AWS refused {error.operation_name}: {details.get('Code')}: {details.get('Message')}"
    if isinstance(error, BotoCoreError):
        return ExitCode.AWS, str(error)
    return None


def _network_error(error: BaseException) -> tuple[ExitCode, str] | None:
    import urllib.error

    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        return ExitCode.NOT_RUNNING, (
            f"cannot reach {error.reason}: is `servestack local up` still running? "
            "(start it again; a state file left by one that crashed is replaced)"
        )
    if isinstance(error, ConnectionError):
        return ExitCode.NOT_RUNNING, f"{error}: is `servestack local up` still running? (start it again)"
    if "httpx" not in sys.modules:  # never imported (or not installed): nothing of httpx can have been raised
        return None
    import httpx

    if isinstance(error, httpx.ConnectError | httpx.RemoteProtocolError):
        return ExitCode.NOT_RUNNING, f"cannot reach {error.request.url}: is `servestack local up` still running? " + (
            "(start it again; a state file left by one that crashed is replaced)"
        )
    return None
