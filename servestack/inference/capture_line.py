"""A capture record's log line, written straight as bytes: the hot half of data capture
(servestack/inference/capture.py), paid by every sampled request.

The line is byte for byte what `orjson.dumps(capture_record(...))` writes (tests/unit/test_capture_line.py
holds the two equal), built from pieces made once per process (a model's `servestack` block, a media type's
part openings) and the request's own: its inputs' JSON text and its answer, each written as a JSON string,
and the event's id and time (`EventStamps`). Building the record as a dict and dumping it, with a fresh
`uuid.uuid4()` and `datetime.isoformat`, made a one-row record cost about twice as much in process
(bench/capture_cost.py), and the realtime container's CPU per one-row request 1.32x capture off against 1.22x
now (`bench.realtime --only capture`; docs/performance.md).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import random
import time
import uuid
from datetime import UTC, datetime

import orjson

from servestack.inference.media_types import CSV, JSON

EVENT_VERSION = "0"
# The encodings SageMaker names text parts by; any other media type is written in base64.
_TEXT_KINDS = {JSON: "JSON", CSV: "CSV"}


_CAPTURE_OPEN = b'{"captureData":{'
_EVENT_OPEN = b'},"eventMetadata":{"eventId":"'
_TIME_OPEN = b'","inferenceTime":"'
_ID_FORMAT = b"%s%012x"
_BLOCK_OPEN = b'"},"eventVersion":"' + EVENT_VERSION.encode("ascii") + b'","servestack":'


class EventStamps:
    """Each record's `eventId` and `inferenceTime`, cheaply: `uuid.uuid4()` (a getrandom(2) call and a UUID
    object) and `datetime.isoformat` were ~6 µs of a one-row record.

    An id is UUID-shaped, version 4: the process's own random first 80 bits (74 of them random, as `uuid4`
    draws them), then a 48-bit counter from a random start. Ids stay unique within a process, and across
    processes as random UUIDs are; a forked child draws its own prefix (`os.register_at_fork`), so that workers
    forked from one parent do not repeat each other's ids. The time's text is made once a millisecond (its part up
    to the second once a second); the milliseconds are truncated, as `isoformat(timespec="milliseconds")` does."""

    def __init__(self) -> None:
        self._second = -1
        self._second_text = b""
        self.millisecond = -1
        self._millisecond_text = b""
        # `","inferenceTime":"` and the time's text: what follows the id in a line (`Capturer.answered_raw`).
        self.time_piece = b""
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        prefix = str(uuid.uuid4())[:24].encode("ascii")  # "xxxxxxxx-xxxx-4xxx-yxxx-"
        # The ids, formatted in C as they are taken (`next(STAMPS.ids)`): no Python frame per id. The counter starts
        # below 2^47, so it stays within its 12 hex digits for 2^47 ids of one process.
        self.ids = map(_ID_FORMAT.__mod__, zip(itertools.repeat(prefix), itertools.count(random.getrandbits(47))))

    def event_id(self) -> bytes:
        return next(self.ids)

    def inference_time(self) -> bytes:
        millisecond = int(time.time() * 1000)
        if millisecond != self.millisecond:  # several requests a millisecond share its text under load
            second = millisecond // 1000
            if second != self._second:
                stamp = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.").encode("ascii")
                self._second, self._second_text = second, stamp
            self._millisecond_text = b"%s%03dZ" % (self._second_text, millisecond - second * 1000)
            self.time_piece = _TIME_OPEN + self._millisecond_text
            self.millisecond = millisecond
        return self._millisecond_text


STAMPS = EventStamps()


def part(mode: str, media_type: str, data: bytes) -> dict[str, str]:
    """SageMaker's `endpointInput`/`endpointOutput`: text as it is (JSON or CSV), anything else in base64."""
    text_kind = _TEXT_KINDS.get(media_type.split(";")[0].strip())
    if text_kind is not None:
        try:
            text = data.decode("utf-8")
            return {"observedContentType": media_type, "mode": mode, "data": text, "encoding": text_kind}
        except UnicodeDecodeError:
            pass
    return {
        "observedContentType": media_type,
        "mode": mode,
        "data": base64.b64encode(data).decode("ascii"),
        "encoding": "BASE64",
    }


def escaped_orjson_text(text: bytes) -> bytes:
    """JSON text that orjson wrote, as the inside of a JSON string: byte for byte what `orjson.dumps(text.decode())`
    writes between its quotes, at a fraction of its cost (two C `replace`s, no decoding). orjson's text is valid
    UTF-8 and holds no raw control character (it escapes them), so a quote and a backslash are all that a JSON
    string must escape in it (RFC 8259, section 7); orjson leaves everything else as it is, as this does."""
    return text.replace(b"\\", b"\\\\").replace(b'"', b'\\"')


class _PartWriter:
    """`orjson.dumps(part(mode, media_type, data))` of one mode and media type, its fixed pieces made once."""

    __slots__ = ("base64_close", "open", "text_close")

    def __init__(self, key: bytes, mode: str, media_type: str) -> None:
        self.open = b'%s:{"observedContentType":%s,"mode":"%s","data":' % (
            key,
            orjson.dumps(media_type),
            mode.encode("ascii"),
        )
        text_kind = _TEXT_KINDS.get(media_type.split(";")[0].strip())
        self.text_close = None if text_kind is None else b',"encoding":"%s"}' % text_kind.encode("ascii")
        self.base64_close = b'","encoding":"BASE64"}'

    def write(self, data: bytes) -> bytes:
        if self.text_close is not None:
            try:
                return self.open + orjson.dumps(data.decode("utf-8")) + self.text_close
            except UnicodeDecodeError:
                pass
        return b'%s"%s%s' % (self.open, base64.b64encode(data), self.base64_close)


# What `LineWriter.answer_line` keeps per model and answer type: the answer's part writer, the pieces around a text
# answer, and the line's end from its `servestack` block on.
_Frame = tuple[_PartWriter, bytes, bytes, bytes]


class LineWriter:
    """The log lines of one capture setting: `line(...)` is `orjson.dumps(capture_record(...))` plus a newline.
    A line is joined once from its pieces (`bytes.join`), which is cheaper than `%`-formatting them."""

    def __init__(self, deployment: str, mode: str, what: str, variant: str | None) -> None:
        self._deployment, self._mode, self._variant = deployment, mode, variant
        self._inputs = what != "outputs"
        self._outputs = what != "inputs"
        self._parts: dict[tuple[str, str], _PartWriter] = {}
        self._blocks: dict[tuple[str, str], bytes] = {}
        self._json_input = _PartWriter(b'"endpointInput"', "INPUT", JSON)
        self._frames: dict[tuple[str, str, str], _Frame] = {}
        self._json_input_open = _CAPTURE_OPEN + self._json_input.open + b'"'
        self._json_input_close = b'"' + (self._json_input.text_close or b"")

    def servestack_block(self, model: str, version: str, job_id: str | None) -> dict[str, str | None]:
        return {
            "deployment": self._deployment,
            "mode": self._mode,
            "model": model,
            "version": version,
            "variant": self._variant,
            "job_id": job_id,
        }

    def line(
        self,
        model: str,
        version: str,
        inputs: bytes | None,
        output: bytes | None,
        output_type: str,
        job_id: str | None,
        event_id: bytes,
        inference_time: bytes,
        *,
        inputs_from_orjson: bool = False,
        input_type: str | None = None,
    ) -> bytes:
        """`inputs_from_orjson`: `inputs` is JSON text orjson wrote (`capture.inputs_json`), escaped by
        `escaped_orjson_text` rather than decoded and dumped again. (An answer's escape costs about the same either
        way, being short.)"""
        pieces = [_CAPTURE_OPEN]
        if inputs is not None and self._inputs:
            if inputs_from_orjson:
                writer = self._json_input
                pieces += (writer.open, b'"', escaped_orjson_text(inputs), b'"', writer.text_close or b"")
            else:
                kind = input_type or (JSON if inputs[:1] == b"{" else "application/octet-stream")
                pieces.append(self._writer("INPUT", kind).write(inputs))
        if output is not None and self._outputs:
            if len(pieces) > 1:
                pieces.append(b",")
            pieces.append(self._writer("OUTPUT", output_type).write(output))
        pieces += (_EVENT_OPEN, event_id, _TIME_OPEN, inference_time)
        if job_id is None:
            pieces.append(self._block(model, version))
        else:
            pieces += (_BLOCK_OPEN, orjson.dumps(self.servestack_block(model, version, job_id)), b"}\n")
        return b"".join(pieces)

    def answer_line(
        self,
        model: str,
        version: str,
        inputs: bytes,
        input_type: str | None,
        output: bytes,
        output_type: str,
        event_id: bytes,
        time: bytes,
    ) -> bytes | None:
        """`line` with both parts and no job id, in one join of a few pieces made once per model and media type
        (`_frame`): the line of a sampled online request, the one every such request pays. `input_type`: the
        request body's media type, `inputs` the body as it came; None: `inputs` is JSON text orjson wrote
        (`line(..., inputs_from_orjson=True)`). None where it does not apply (capture of one part only), for
        `line`."""
        frame = self._frames.get((model, version, output_type))
        if frame is None:
            frame = self._frame(model, version, output_type)
            if frame is None:
                return None
        writer, output_open, tail, block = frame
        answer = None
        if writer.text_close is not None:
            with contextlib.suppress(UnicodeDecodeError):
                answer = orjson.dumps(output.decode("utf-8"))
        if answer is None:  # an answer that is not text (`.npy`) or not UTF-8: base64, as `line` writes it
            output_open, answer, tail = b",", writer.write(output), _EVENT_OPEN
        if input_type is None:
            # `escaped_orjson_text(inputs)`, inline: this runs once per sampled request.
            escaped = inputs.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
            return b"".join(
                (self._json_input_open, escaped, self._json_input_close, output_open, answer, tail, event_id,
                 _TIME_OPEN, time, block)
            )  # fmt: skip
        part = self._writer("INPUT", input_type).write(inputs)
        return b"".join((_CAPTURE_OPEN, part, output_open, answer, tail, event_id, _TIME_OPEN, time, block))

    def body_frame(
        self, model: str, version: str, body_type: str, output_type: str
    ) -> tuple[bytes, bytes, bytes, bytes] | None:
        """The pieces of an online line around a request's body as it came and its answer, both text: the line is
        `opening`, the body as a JSON string, `middle`, the answer as one, `closing`, the event's id,
        `EventStamps.time_piece` and `block`, byte for byte `line(...)` (`Capturer.answered_raw`). None where either
        is not JSON or CSV text, or where capture holds one part only."""
        if not (self._inputs and self._outputs):
            return None
        body, answer = self._writer("INPUT", body_type), self._writer("OUTPUT", output_type)
        if body.text_close is None or answer.text_close is None:
            return None
        return (
            _CAPTURE_OPEN + body.open,
            body.text_close + b"," + answer.open,
            answer.text_close + _EVENT_OPEN,
            self._block(model, version),
        )

    def _frame(self, model: str, version: str, output_type: str) -> _Frame | None:
        if not (self._inputs and self._outputs):
            return None
        output = self._writer("OUTPUT", output_type)
        close = output.text_close or b""  # unused for an answer that is not text: `answer_line` writes it whole
        frame = (output, b"," + output.open, close + _EVENT_OPEN, self._block(model, version))
        if len(self._frames) < 64:  # as `_parts`: a few models and media types a process
            self._frames[(model, version, output_type)] = frame
        return frame

    def _block(self, model: str, version: str) -> bytes:
        """The end of a line without a job id, from its `servestack` block on."""
        block = self._blocks.get((model, version))
        if block is None:  # a few models a process: each block once
            servestack = orjson.dumps(self.servestack_block(model, version, None))
            block = self._blocks[(model, version)] = _BLOCK_OPEN + servestack + b"}\n"
        return block

    def _writer(self, mode: str, media_type: str) -> _PartWriter:
        writer = self._parts.get((mode, media_type))
        if writer is None:
            key = b'"endpointInput"' if mode == "INPUT" else b'"endpointOutput"'
            writer = _PartWriter(key, mode, media_type)
            if len(self._parts) < 64:  # media types come from a short list, but a client's parameters vary
                self._parts[(mode, media_type)] = writer
        return writer
