"""Data capture: which requests are recorded (`CapturePolicy`), the record (`capture_record`, docs/monitoring.md's
"Capture records"), and its emission as one log line per sampled request (`Capturer`).

A record is SageMaker's data capture shape plus a `servestack` block (deployment, mode, model, version, variant,
async job id). Its input is the request's body as it came, with its media type (as SageMaker's own capture
records it); with columns excluded (or where the body is not at hand: an async job, a spooled body), the decoded
inputs the model saw, column by column (`{"inputs": {name: [values]}}`, a body servestack's request forms accept
again), without the excluded ones. Its output is the answer's body.

Emission is one line on stdout, the record itself, written after the answer has been sent: the
platform ships stdout to CloudWatch Logs (Lambda, SageMaker, ECS), where a subscription filter hands the capture
lines to Kinesis Data Firehose, which writes them to S3 (servestack/cdk/capture.py). A request pays its body's
escape (or its inputs' JSON dump), the line's bytes (servestack/inference/capture_line.py) and its share of a
burst of writes (`Capturer.coalesce`); a slow or failing S3 or Firehose never touches it, and no AWS client is
called per request.

The policy comes from one setting, `SERVESTACK_CAPTURE` (a JSON object the CDK constructs and local mode write).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import orjson

from servestack.inference.capture_bursts import LineBursts
from servestack.inference.capture_line import EVENT_VERSION, STAMPS, LineWriter, part
from servestack.inference.errors import ConfigurationError
from servestack.inference.manifest import ColumnSpec, Manifest
from servestack.inference.media_types import JSON, Encoded

if TYPE_CHECKING:
    from servestack.inference.service import ServedModel

logger = logging.getLogger("servestack.capture")

MODES = ("realtime", "serverless", "async", "batch")
WHATS = ("inputs", "outputs", "both")
# CloudWatch Logs takes events of at most 256 KiB, 26 bytes of which are its own; a longer line would be cut (and
# be no JSON any more). A record past it is written without its data, marked `"dropped"` with its size.
MAX_LINE_BYTES = 256 * 1024 - 26
_now = time.time


class CaptureSetting(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`SERVESTACK_CAPTURE`: serving.yaml's `capture:` block and where the deployment runs."""

    deployment: str
    mode: str
    sample_percent: float = 100.0
    what: str = "both"
    exclude_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.sample_percent <= 100:
            raise ValueError(f"sample_percent {self.sample_percent} is not in 0..100")
        if self.what not in WHATS:
            raise ValueError(f"what {self.what!r} is not one of {', '.join(WHATS)}")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")


def parse_setting(text: str) -> CaptureSetting | None:
    """The capture setting of `SERVESTACK_CAPTURE` ('' or absent: capture is off)."""
    if not text.strip():
        return None
    try:
        return msgspec.json.decode(text, type=CaptureSetting)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigurationError(
            f"SERVESTACK_CAPTURE: {text[:200]!r} is invalid: {exc}",
            field="SERVESTACK_CAPTURE",
            value=text[:200],
            allowed='{"deployment": ..., "mode": ..., "sample_percent": 0..100, "what": inputs|outputs|both, '
            '"exclude_columns": [...]}',
        ) from None


@dataclass
class CapturePolicy:
    """Whether a request is captured (`sampled`: each with probability `sample_percent`/100, drawn from `draw`,
    uniform in [0, 1)) and what of it."""

    setting: CaptureSetting
    draw: Callable[[], float] = field(default=random.random)

    def sampled(self) -> bool:
        percent = self.setting.sample_percent
        return percent >= 100 or (percent > 0 and self.draw() * 100 < percent)


def _inference_time(now: datetime | None) -> str:
    if now is None:
        return STAMPS.inference_time().decode("ascii")
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def input_columns(
    arrays: Mapping[str, np.ndarray], columns: tuple[ColumnSpec, ...], exclude: Iterable[str]
) -> dict[str, Any]:
    """The inputs column by column: a tabular model's named columns (an `[N, k]` input split into its k columns),
    else each input whole; the excluded names (columns or inputs) left out."""
    left_out = set(exclude)
    if columns:
        out: dict[str, Any] = {}
        for column in columns:
            if column.name in left_out or column.input in left_out or column.input not in arrays:
                continue
            array = arrays[column.input]
            values = array[:, column.index] if column.index is not None else array.reshape(array.shape[0], -1)[:, 0]
            out[column.name] = _jsonable(values)
        return out
    return {name: _jsonable(array) for name, array in arrays.items() if name not in left_out}


def _jsonable(array: np.ndarray) -> Any:
    """Numbers stay an array, which orjson writes itself (several times faster than `tolist()` and its floats);
    text and the rest become lists."""
    if array.dtype.kind in "biuf":
        return np.ascontiguousarray(array)
    return array.tolist()


def capture_record(
    setting: CaptureSetting,
    *,
    model: str,
    version: str,
    variant: str | None,
    inputs: bytes | None,
    output: bytes | None,
    output_type: str = JSON,
    job_id: str | None = None,
    event_id: str | None = None,
    now: datetime | None = None,
    inference_time: str | None = None,
) -> dict[str, Any]:
    """One capture record (docs/monitoring.md): `inputs` is the JSON text of `{"inputs": {...}}` (or a raw body,
    `application/octet-stream`), `output` the answer's body; each is left out as `what` says."""
    data: dict[str, Any] = {}
    if inputs is not None and setting.what != "outputs":
        kind = JSON if inputs[:1] == b"{" else "application/octet-stream"
        data["endpointInput"] = part("INPUT", kind, inputs)
    if output is not None and setting.what != "inputs":
        data["endpointOutput"] = part("OUTPUT", output_type, output)
    return {
        "captureData": data,
        "eventMetadata": {
            "eventId": event_id or STAMPS.event_id().decode("ascii"),
            "inferenceTime": inference_time or _inference_time(now),
        },
        "eventVersion": EVENT_VERSION,
        "servestack": {
            "deployment": setting.deployment,
            "mode": setting.mode,
            "model": model,
            "version": version,
            "variant": variant or None,
            "job_id": job_id,
        },
    }


def inputs_json(
    arrays: Mapping[str, np.ndarray], columns: tuple[ColumnSpec, ...], exclude: Iterable[str]
) -> bytes | None:
    """`{"inputs": {...}}` as JSON text; None for inputs JSON cannot hold (raw bytes)."""
    # A tensor model's inputs go whole: orjson writes numeric arrays itself, and hands the rest to `_as_list`.
    inputs = input_columns(arrays, columns, exclude) if columns or exclude else dict(arrays)
    try:
        # NaN and infinities become null (orjson), as the request forms read null in a float column.
        return orjson.dumps({"inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY, default=_as_list)
    except TypeError:
        return None


def _as_list(value: Any) -> Any:
    # orjson hands over the arrays it does not write itself (a dtype it lacks: float16 in older releases).
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(type(value).__name__)


def _write_stdout(lines: bytes) -> None:
    # Whole lines in one write(2): the workers of a container share its stdout, and what one call writes is not
    # interleaved with another's up to the pipe's atomic size (PIPE_BUF, 4 KiB); CloudWatch takes each line as
    # one event.
    os.write(1, lines)


class Capturer:
    """Records the sampled requests of one serving process as log lines (`emit`)."""

    def __init__(
        self,
        setting: CaptureSetting,
        *,
        variant: str | None = None,
        draw: Callable[[], float] = random.random,
        write: Callable[[bytes], None] = _write_stdout,
    ) -> None:
        self.setting = setting
        self.policy = CapturePolicy(setting, draw)
        self.variant = variant or None
        self.write = write
        self.exclude = frozenset(setting.exclude_columns)
        self._both = setting.what == "both"
        # Every request sampled: the caller need not draw (`sampled`).
        self.always = setting.sample_percent >= 100
        # An online request's record holds its body as it came (`answered_raw`): both parts, no column left out.
        self.raw_online = self._both and not self.exclude
        self._body_frames: dict[tuple[str, str, str, str], tuple[bytes, bytes, bytes, bytes] | None] = {}
        self._last_manifest: Manifest | None = None
        self._last_body_type: str | None = None
        self._last_type: str | None = None
        self._last_frame: tuple[bytes, bytes, bytes, bytes] | None = None
        self.lines = LineWriter(setting.deployment, setting.mode, setting.what, self.variant)
        self._bursts: LineBursts | None = None

    def coalesce(self, loop: asyncio.AbstractEventLoop) -> None:
        """From now on, lines wait and go out together in bursts that never stall `loop`
        (servestack/inference/capture_bursts.py): for a serving container's loop, on whose thread every request is
        answered; never for a Lambda function, frozen as soon as its invocation returns. What a SIGKILLed worker
        held, at most `FLUSH_AFTER_SEC` of records (more while its log driver lags), is lost with it, as a log line
        still in a buffer would be; SIGTERM writes it (`flush`)."""
        if self.write is _write_stdout:
            self._bursts = LineBursts.to_fd(loop, 1)
        else:
            self._bursts = LineBursts(loop, self.write, None)

    def flush(self) -> None:
        """Write every line waiting (`coalesce`), waiting for the pipe if need be: at shutdown."""
        if self._bursts is not None:
            self._bursts.flush(wait=True)

    def sampled(self) -> bool:
        return self.policy.sampled()

    def emit(
        self,
        *,
        model: str,
        version: str,
        columns: tuple[ColumnSpec, ...],
        arrays: Mapping[str, np.ndarray] | None,
        output: bytes | None,
        output_type: str = JSON,
        body: bytes | None = None,
        job_id: str | None = None,
    ) -> None:
        """Write the record of one sampled request (call `sampled()` first). `body`: the raw request, recorded
        (base64) only when the inputs are none JSON can hold, and never with excluded columns (it holds them)."""
        self._record(model, version, columns, arrays, output, output_type, body, job_id, None)

    def _record(
        self,
        model: str,
        version: str,
        columns: tuple[ColumnSpec, ...],
        arrays: Mapping[str, np.ndarray] | None,
        output: bytes | None,
        output_type: str,
        body: bytes | None,
        job_id: str | None,
        body_type: str | None,
    ) -> None:
        # `emit`'s work, with positional arguments. `body_type`: `body` is the request as it came, in this media
        # type, recorded as it is when no column is left out (`answered`).
        inputs: bytes | None = None
        from_orjson = False
        if self.setting.what != "outputs":
            if body is not None and body_type is not None and not self.exclude:
                inputs = body
            elif arrays is not None:
                inputs = inputs_json(arrays, columns, self.exclude)
                from_orjson = inputs is not None
                if inputs is None and not self.exclude:
                    inputs, body_type = body, None
        event_id, inference_time = STAMPS.event_id(), STAMPS.inference_time()
        # The record as it is, so the objects Firehose writes hold the one format (docs/monitoring.md); a log
        # subscription tells these lines from the others by their `servestack.deployment`.
        line = self.lines.line(
            model,
            version,
            inputs,
            output,
            output_type,
            job_id,
            event_id,
            inference_time,
            inputs_from_orjson=from_orjson,
            input_type=body_type,
        )
        if len(line) > MAX_LINE_BYTES:
            record = capture_record(
                self.setting,
                model=model,
                version=version,
                variant=self.variant,
                inputs=None,
                output=None,
                job_id=job_id,
                event_id=event_id.decode("ascii"),
                inference_time=inference_time.decode("ascii"),
            )
            record["servestack"]["dropped"] = f"record of {len(line)} bytes > {MAX_LINE_BYTES} (a log event's limit)"
            line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        self._out(line)

    def _out(self, line: bytes) -> None:
        """Write `line` now, or with the next burst (`coalesce`)."""
        if self._bursts is None:
            self.write(line)
        else:
            self._bursts.add(line)

    def answered_raw(
        self, model: ServedModel, arrays: Mapping[str, np.ndarray], encoded: Encoded, body: bytes, body_type: str
    ) -> None:
        """`answered(model, arrays, encoded, body, None, body_type)` where `raw_online` holds: the line of every
        sampled request of a serving container, in one join of the request's body and answer (each a JSON string)
        and pieces made once per model and media types (`LineWriter.body_frame`). Anything else (a body or answer
        that is not text, a line past a log event's limit) takes `answered`."""
        try:
            manifest, answer_type = model.manifest, encoded.media_type
            # The last request's frame, where this one has the same model and media types (their objects: the
            # usual case, each request of a worker alike), else the frame of its model and media types.
            if manifest is self._last_manifest and body_type is self._last_body_type and answer_type is self._last_type:
                frame = self._last_frame
            else:
                frame = self._body_frame(manifest, body_type, answer_type)
            if frame is not None:
                opening, middle, closing, block = frame
                stamps = STAMPS
                if int(_now() * 1000) != stamps.millisecond:  # the time's text, made once a millisecond
                    stamps.inference_time()
                line = b"".join((
                    opening, orjson.dumps(body.decode()), middle, orjson.dumps(encoded.body.decode()), closing,
                    next(stamps.ids), stamps.time_piece, block,
                ))  # fmt: skip
                if len(line) <= MAX_LINE_BYTES:
                    self._out(line)
                    return
        except UnicodeDecodeError:  # not UTF-8 text: base64, as `answered` writes it
            pass
        except Exception:
            logger.exception("data capture failed for %s", model.key)
            return
        self.answered(model, arrays, encoded, body, None, body_type)

    def _body_frame(
        self, manifest: Manifest, body_type: str, answer_type: str
    ) -> tuple[bytes, bytes, bytes, bytes] | None:
        key = (manifest.name, manifest.version, body_type, answer_type)
        if key in self._body_frames:
            frame = self._body_frames[key]
        else:
            frame = self.lines.body_frame(manifest.name, manifest.version, body_type, answer_type)
            if len(self._body_frames) < 64:  # a few models and media types a process
                self._body_frames[key] = frame
        self._last_manifest, self._last_body_type, self._last_type = manifest, body_type, answer_type
        self._last_frame = frame
        return frame

    def answered(
        self,
        model: ServedModel,
        arrays: Mapping[str, np.ndarray],
        encoded: Encoded,
        body: bytes | None = None,
        job_id: str | None = None,
        body_type: str | None = None,
    ) -> None:
        """Record a sampled request `model` answered; a failure here is logged, never the client's: its answer
        has been sent (or stored) already. `body` and `body_type`: the request's body as it came and its media
        type, which the record holds when no column is left out (as SageMaker's own capture does); without them,
        or with columns left out, the record holds the decoded inputs column by column."""
        try:
            manifest = model.manifest
            if job_id is None and self._both:  # an online request: its line in one join, as `answer_line` can
                raw = body is not None and body_type is not None and not self.exclude
                inputs = body if raw else inputs_json(arrays, model.columns, self.exclude)
                if inputs is not None:
                    line = self.lines.answer_line(
                        manifest.name,
                        manifest.version,
                        inputs,
                        body_type if raw else None,
                        encoded.body,
                        encoded.media_type,
                        STAMPS.event_id(),
                        STAMPS.inference_time(),
                    )
                    if line is not None and len(line) <= MAX_LINE_BYTES:
                        self._out(line)
                        return
            self._record(
                manifest.name,
                manifest.version,
                model.columns,
                arrays,
                encoded.body,
                encoded.media_type,
                body,
                job_id,
                body_type,
            )
        except Exception:
            logger.exception("data capture failed for %s", model.key)


def capturer_from(text: str, *, variant: str | None = None) -> Capturer | None:
    """The process's capturer from `SERVESTACK_CAPTURE`, None when capture is off."""
    setting = parse_setting(text)
    return None if setting is None else Capturer(setting, variant=variant)


def records_of(lines: Iterable[bytes | str]) -> list[dict[str, Any]]:
    """The capture records of JSON Lines text (blank lines skipped)."""
    return [orjson.loads(line) for line in lines if line.strip()]
