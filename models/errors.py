"""The one exception hierarchy of servestack.

Every error knows the HTTP status an adapter should answer with and whether retrying the same request can
help. Messages name the field, the value received and what is allowed, so the caller knows what to fix.
Adapters map these to status codes (HTTP), to retry decisions (SQS) or to error files (batch); nothing
else in the code base invents its own error classes for serving failures.
"""

from __future__ import annotations

from typing import Any, ClassVar


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
        """The `error` object of a JSON error body."""
        body: dict[str, Any] = {"type": self.error_type, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
            body["value"] = _printable(self.value)
        if self.allowed is not None:
            body["allowed"] = self.allowed
        return body


def _printable(value: Any) -> Any:
    """Keep error bodies small and JSON-safe whatever the caller sent."""
    if value is None or isinstance(value, bool | int | str):
        return value if not isinstance(value, str) or len(value) <= 80 else value[:77] + "..."
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    text = repr(value)
    if isinstance(value, list | tuple) and len(text) <= 80:
        return [_printable(item) for item in value]
    if isinstance(value, dict) and len(text) <= 80:
        return {str(key): _printable(item) for key, item in value.items()}
    return text if len(text) <= 80 else text[:77] + "..."


class InvalidInput(ServingError):
    """The request is malformed or does not match the model's signature. Fix the request."""

    status_code = 400
    error_type = "InvalidInput"


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
