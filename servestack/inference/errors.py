"""The one exception hierarchy of servestack.

Every error knows the HTTP status an adapter should answer with and whether retrying the same request can
help. Messages name the field, the value received and what is allowed, so the caller knows what to fix.
Adapters map these to status codes (HTTP), to retry decisions (SQS) or to error files (batch); nothing
else in the code base invents its own error classes for serving failures.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any, ClassVar

# What a client may see of an error is bounded: a message of at most this many characters...
MAX_MESSAGE_CHARS = 1000
# ...and values printed by `reprlib` with these limits, so a 6 MiB list or a 1,000-deep one costs no more
# to describe than a short one (a plain `repr` of either is slow, large, or a RecursionError).


class _BoundedRepr(reprlib.Repr):
    """`reprlib.Repr` that never writes out a huge integer: `repr` of one past 4,300 digits raises ValueError
    (Python's limit on int-to-str conversion), and below that it costs time quadratic in the digits."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > _INT_BITS_SHOWN:
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_INT_BITS_SHOWN = 256
_REPR = _BoundedRepr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 8
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40

# Server-side locations never reach a client: URIs (s3://bucket/prefix, file:///...) and absolute file system
# paths of two or more segments. API routes that messages name on purpose (`POST /jobs/uploads`) are kept.
_URI = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\",;)\]]*")
_ROUTES = "jobs|v1|invocations|ping|models|endpoints|_servestack|2015-03-31"
_PATH = re.compile(rf"(?<![\w.:/@-])/(?!(?:{_ROUTES})\b)[\w.@+~-]+(?:/[\w.@+~-]*)+")


def redact(text: str) -> str:
    """`text` without server paths or URIs, and at most MAX_MESSAGE_CHARS long: what a client may read."""
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 3] + "..."
    if "/" not in text:
        return text
    return _PATH.sub("<path>", _URI.sub("<uri>", text))


class ServingError(Exception):
    """Base of every error servestack reports to a caller."""

    status_code: ClassVar[int] = 500
    retryable: ClassVar[bool] = False
    error_type: ClassVar[str] = "ServingError"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        value: Any = None,
        allowed: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value
        self.allowed = allowed

    def to_dict(self) -> dict[str, Any]:
        """The `error` object of a JSON error body: bounded in size, with server paths and URIs redacted."""
        body: dict[str, Any] = {"type": self.error_type, "message": redact(self.message)}
        if self.field is not None:
            body["field"] = redact(self.field)
            value = _printable(self.value)
            body["value"] = redact(value) if isinstance(value, str) else value
        if self.allowed is not None:
            body["allowed"] = redact(self.allowed)
        return body


def short_repr(value: Any) -> str:
    """`repr(value)` at most ~80 characters, in time and memory that do not grow with the value."""
    return _REPR.repr(value)


def _printable(value: Any) -> Any:
    """Keep error bodies small and JSON-safe whatever the caller sent."""
    if value is None or isinstance(value, bool | str) or (isinstance(value, int) and abs(value) < 10**18):
        return value if not isinstance(value, str) or len(value) <= 80 else value[:77] + "..."
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    text = _REPR.repr(value)
    whole = "..." not in text and len(text) <= 80  # reprlib marks whatever it left out with "..."
    if isinstance(value, list | tuple) and whole:
        return [_printable(item) for item in value]
    if isinstance(value, dict) and whole:
        return {str(key): _printable(item) for key, item in value.items()}
    return text if len(text) <= 80 else text[:77] + "..."


class InvalidInput(ServingError):
    """The request is malformed or does not match the model's signature. Fix the request."""

    status_code = 400
    error_type = "InvalidInput"


class NoInput(InvalidInput):
    """A batch run found nothing to score under its input prefix. The run fails, in every batch engine, so that
    the deployment's failure alarm counts it: a scheduled run with nothing to read usually means the input did
    not arrive (docs/batch.md, "A run with no input")."""

    error_type = "NoInput"


def unconvertible(field: str, error: ValueError | OverflowError) -> InvalidInput:
    """A value that a number parser or a cast refused (an integer of 5,000 digits, which `int` refuses with a
    ValueError; one past a dtype's range, an OverflowError), as the caller's mistake: decoding turns any such
    error that its own checks did not name first into this, never a 500."""
    reason = str(error).split(";")[0][:160]  # Python's advice on sys.set_int_max_str_digits is not the caller's
    return InvalidInput(
        f"{field}: a value cannot be converted to the model's dtype ({type(error).__name__}: {reason})",
        field=field,
        value=type(error).__name__,
        allowed="values of the model's dtypes, within their range (integers of at most 19 digits)",
    )


class ModelNotFound(ServingError):
    """No model of that name (or version) is served here."""

    status_code = 404
    error_type = "ModelNotFound"


class PayloadTooLarge(ServingError):
    """The body is over the configured limit."""

    status_code = 413
    error_type = "PayloadTooLarge"


class UnsupportedMediaType(ServingError):
    """The Content-Type is not one the codecs read."""

    status_code = 415
    error_type = "UnsupportedMediaType"


class NotAcceptable(ServingError):
    """The Accept header asks for a type the codecs cannot write."""

    status_code = 406
    error_type = "NotAcceptable"


class ModelNotReady(ServingError):
    """The model is still loading or warming up; retry shortly."""

    status_code = 503
    retryable = True
    error_type = "ModelNotReady"


class ModelLoadError(ServingError):
    """A model package could not be loaded: bad manifest, bad ONNX file, failed warmup."""

    status_code = 500
    error_type = "ModelLoadError"


class ChecksumMismatch(ModelLoadError):
    """The model file's sha256 differs from the manifest's: the artifact was altered or corrupted."""

    error_type = "ChecksumMismatch"


class UserCodeError(ServingError):
    """A hook in the model package's `process.py` failed for a reason other than bad input."""

    status_code = 500
    error_type = "UserCodeError"


class InferenceError(ServingError):
    """onnxruntime failed on input that passed validation; a bug or resource problem, not the caller's."""

    status_code = 500
    error_type = "InferenceError"


class ConfigurationError(ServingError):
    """A setting has a value servestack cannot use; raised at start-up, never per request."""

    status_code = 500
    error_type = "ConfigurationError"


class InternalError(ServingError):
    """Something failed that is neither the caller's mistake nor a known failure; details go to the log."""

    status_code = 500
    error_type = "InternalError"


class RequestTimeout(ServingError):
    """The body did not arrive within the read deadline; the slot it would have taken went to others."""

    status_code = 408
    retryable = True
    error_type = "RequestTimeout"


class Overloaded(ServingError):
    """Too much work is queued in this worker; retry after `retry_after_sec` (HTTP 429 with Retry-After)."""

    status_code = 429
    retryable = True
    error_type = "Overloaded"

    def __init__(self, message: str, *, retry_after_sec: int = 1, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after_sec = retry_after_sec


class DeadlineExceeded(ServingError):
    """The request's deadline passed before an answer was ready; work not yet started was dropped."""

    status_code = 504
    retryable = True
    error_type = "DeadlineExceeded"


class JobNotFound(ServingError):
    """No async job has that id (never submitted, or expired by the table's TTL)."""

    status_code = 404
    error_type = "JobNotFound"


class JobFailed(ServingError):
    """The job already ended `failed`; a redelivered message for it fails fast with the recorded reason."""

    status_code = 409
    error_type = "JobFailed"


class IdempotencyConflict(ServingError):
    """An idempotency key was reused with a different request; keys name one request, forever."""

    status_code = 422
    error_type = "IdempotencyConflict"


class IdempotencyInProgress(ServingError):
    """The request an idempotency key names is still being processed by another call: retry shortly (the IETF
    Idempotency-Key header draft answers 409 Conflict; Powertools raises IdempotencyAlreadyInProgressError)."""

    status_code = 409
    retryable = True
    error_type = "IdempotencyInProgress"


class VersionConflict(ServingError):
    """A registry version is immutable: it was pushed before with different bytes. Push a new version."""

    status_code = 409
    error_type = "VersionConflict"


class ModelAlreadyLoaded(ServingError):
    """Multi-model contract: a model is already loaded under that name (SageMaker expects HTTP 409)."""

    status_code = 409
    error_type = "ModelAlreadyLoaded"


class InsufficientMemory(ServingError):
    """Multi-model contract: loading would pass the memory budget. HTTP 507 tells SageMaker to unload least
    recently used models and try again."""

    status_code = 507
    retryable = True
    error_type = "InsufficientMemory"


class RegistryError(ServingError):
    """The model registry cannot be used as asked: bad URI, bad name or version, nothing to roll back to."""

    status_code = 400
    error_type = "RegistryError"


class UnsafePath(ServingError):
    """A name or key would reach outside the directory it must stay in (absolute, `..`, or a link out)."""

    status_code = 400
    error_type = "UnsafePath"
