"""A capture record's line as bytes (servestack/inference/capture_line.py) against the record as a dict
(`capture_record`, the format of docs/monitoring.md), the event's id and time, and the lines of a serving
container written in bursts (`Capturer.coalesce`)."""

from __future__ import annotations

import asyncio
import os
import re
import select
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from hypothesis import given
from hypothesis import strategies as st

from servestack.inference.capture import (
    Capturer,
    CaptureSetting,
    capture_record,
    records_of,
)
from servestack.inference.capture_bursts import FLUSH_AFTER_SEC, FLUSH_BYTES, LineBursts, PipeSpace
from servestack.inference.capture_line import STAMPS, EventStamps, LineWriter

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
MEDIA_TYPES = (
    "application/json",
    "text/csv",
    "text/csv; header=present",
    "application/json; probabilities=by-label",
    "application/x-npy",
)
texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
# JSON text as the inputs are (`{...}`), or raw bytes (a body JSON cannot hold), some not UTF-8.
bodies = st.one_of(texts.map(lambda text: orjson.dumps({"inputs": {"x": [text]}})), st.binary(max_size=30))


@given(
    what=st.sampled_from(("inputs", "outputs", "both")),
    variant=st.one_of(st.none(), texts),
    job_id=st.one_of(st.none(), texts),
    inputs=st.one_of(st.none(), bodies),
    output=st.one_of(st.none(), st.binary(max_size=30), texts.map(str.encode)),
    output_type=st.sampled_from(MEDIA_TYPES),
    model=texts,
)
def test_the_line_is_the_records_json(
    what: str,
    variant: str | None,
    job_id: str | None,
    inputs: bytes | None,
    output: bytes | None,
    output_type: str,
    model: str,
) -> None:
    setting = CaptureSetting(deployment="d\u00e9ploiement", mode="realtime", what=what)
    event_id, when = STAMPS.event_id(), STAMPS.inference_time()
    writer = LineWriter(setting.deployment, setting.mode, setting.what, variant or None)

    for _ in range(2):  # the second from the pieces the first made
        line = writer.line(model, "1", inputs, output, output_type, job_id, event_id, when)
        record = capture_record(
            setting,
            model=model,
            version="1",
            variant=variant,
            inputs=inputs,
            output=output,
            output_type=output_type,
            job_id=job_id,
            event_id=event_id.decode(),
            inference_time=when.decode(),
        )
        assert line == orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


def test_event_ids_are_distinct_version_4_uuids_and_a_new_process_draws_its_own() -> None:
    stamps = EventStamps()
    ids = [stamps.event_id().decode() for _ in range(1000)]
    prefix = ids[0][:24]
    stamps.reseed()  # what a forked child does first (os.register_at_fork)

    assert len(set(ids)) == len(ids)
    assert all(UUID.match(event_id) for event_id in ids)
    assert stamps.event_id().decode()[:24] != prefix


@given(
    values=st.lists(st.one_of(texts, st.floats(), st.integers(-(2**63), 2**63 - 1), st.none()), max_size=8), key=texts
)
def test_inputs_orjson_wrote_are_escaped_as_orjson_escapes_them(values: list[object], key: str) -> None:
    inputs = orjson.dumps({"inputs": {key: values}})
    writer = LineWriter("d", "realtime", "both", None)
    event_id, when = STAMPS.event_id(), STAMPS.inference_time()

    for answer_type in ("application/json", "application/json; probabilities=by-label", "text/csv"):
        answer = orjson.dumps({"predictions": values}) if "json" in answer_type else b"a,b\r\n1,2\n"
        fast = writer.line("m", "1", inputs, answer, answer_type, None, event_id, when, inputs_from_orjson=True)

        assert fast == writer.line("m", "1", inputs, answer, answer_type, None, event_id, when)
        record = orjson.loads(fast)["captureData"]
        assert orjson.loads(record["endpointInput"]["data"]) == orjson.loads(inputs)
        assert record["endpointOutput"]["data"].encode() == answer


@given(
    what=st.sampled_from(("inputs", "outputs", "both")),
    values=st.lists(st.one_of(texts, st.floats(), st.none()), max_size=6),
    output=st.one_of(st.binary(max_size=30), texts.map(str.encode)),
    output_type=st.sampled_from(MEDIA_TYPES),
    model=texts,
)
def test_an_online_requests_line_is_the_general_line(
    what: str, values: list[object], output: bytes, output_type: str, model: str
) -> None:
    inputs = orjson.dumps({"inputs": {"x": values}})
    writer = LineWriter("d", "realtime", what, "blue")
    event_id, when = STAMPS.event_id(), STAMPS.inference_time()

    for _ in range(2):  # the second from the frame the first made
        online = writer.answer_line(model, "1", inputs, None, output, output_type, event_id, when)
        general = writer.line(model, "1", inputs, output, output_type, None, event_id, when, inputs_from_orjson=True)

        if what == "both":
            assert online == general
        else:  # one part only: `line`'s
            assert online is None

        # AND a request's body as it came, in any media type (text, or base64 where it is not UTF-8 text)
        for body_type in MEDIA_TYPES:
            raw = writer.answer_line(model, "1", output, body_type, inputs, "application/json", event_id, when)
            expected = writer.line(
                model, "1", output, inputs, "application/json", None, event_id, when, input_type=body_type
            )
            assert raw == (expected if what == "both" else None)


def test_the_inference_time_is_utc_to_the_millisecond_as_isoformat_writes_it() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    written = EventStamps().inference_time().decode()
    after = datetime.now(UTC)

    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", written)
    assert before <= datetime.fromisoformat(written) <= after


def test_waiting_lines_go_out_together_in_a_burst_of_atomic_writes() -> None:
    writes: list[bytes] = []
    small = {"x": np.zeros((1, 4), dtype=np.float32)}
    wide = {"x": np.zeros((1, 1000), dtype=np.float32)}  # a line of ~4.3 KB, past PIPE_BUF

    async def burst() -> float:
        loop = asyncio.get_running_loop()
        written = loop.create_future()

        def write(lines: bytes) -> None:
            writes.append(lines)
            if not written.done():
                written.set_result(loop.time())

        capturer = Capturer(CaptureSetting(deployment="d", mode="realtime"), write=write)
        capturer.coalesce(loop)
        started = loop.time()
        for arrays in (small, small, wide, small):
            capturer.emit(model="m", version="1", columns=(), arrays=arrays, output=b"{}")
        turned = loop.create_future()
        loop.call_soon(turned.set_result, None)
        await turned
        assert writes == []  # a loop turn later, the lines still wait for the burst
        return await written - started

    waited = asyncio.run(burst())

    assert waited >= FLUSH_AFTER_SEC * 0.9  # the loop's clock may round the timer's deadline down a little
    assert [write.count(b"\n") for write in writes] == [2, 1, 1]  # whole lines; the wide one alone
    assert all(len(write) <= select.PIPE_BUF for write in writes if write.count(b"\n") > 1)
    assert len(records_of(b"".join(writes).splitlines())) == 4


def test_lines_past_the_burst_size_go_out_at_once_and_shut_down_writes_the_rest() -> None:
    writes: list[bytes] = []
    capturer = Capturer(CaptureSetting(deployment="d", mode="realtime"), write=writes.append)
    wide = {"x": np.zeros((1, 1000), dtype=np.float32)}

    async def lines_past_the_burst() -> int:
        capturer.coalesce(asyncio.get_running_loop())
        emitted = 0
        while not writes:  # no await: only the size can have written them
            capturer.emit(model="m", version="1", columns=(), arrays=wide, output=b"{}")
            emitted += 1
        capturer.emit(model="m", version="1", columns=(), arrays=wide, output=b"{}")
        return emitted + 1

    emitted = asyncio.run(lines_past_the_burst())
    lines_at_once = sum(write.count(b"\n") for write in writes)
    bytes_at_once = sum(len(write) for write in writes)
    capturer.flush()  # as the app's shut-down does

    assert bytes_at_once >= FLUSH_BYTES
    assert lines_at_once == emitted - 1  # the last line waits for the next burst, or the shut-down
    assert len(records_of(b"".join(writes).splitlines())) == emitted


class _Manifest:
    def __init__(self, name: str) -> None:
        self.name, self.version = name, "1"


class _Model:
    """The parts of a ServedModel that `Capturer.answered` reads."""

    def __init__(self, name: str) -> None:
        self.manifest, self.columns, self.key = _Manifest(name), (), f"{name}@1"


_STAMPED = re.compile(rb'"eventId":"[^"]*","inferenceTime":"[^"]*"')


@given(
    body=st.one_of(texts.map(str.encode), st.binary(max_size=30)),
    body_type=st.sampled_from(MEDIA_TYPES),
    answer=st.one_of(texts.map(str.encode), st.binary(max_size=30)),
    answer_type=st.sampled_from(MEDIA_TYPES),
    model=texts,
)
def test_an_online_line_from_the_body_as_it_came_is_the_general_line(
    body: bytes, body_type: str, answer: bytes, answer_type: str, model: str
) -> None:
    # GIVEN an online request's body as it came and its answer, in any media type, text or not, UTF-8 or not
    from servestack.inference.media_types import Encoded

    written: list[bytes] = []
    capturer = Capturer(CaptureSetting(deployment="d", mode="realtime"), variant="blue", write=written.append)
    served: Any = _Model(model)
    arrays = {"x": np.zeros((1, 1), np.float32)}
    for _ in range(2):  # the second from the frame the first made
        # WHEN it is captured by the online path (`answered_raw`) and by the general one (`answered`)
        capturer.answered_raw(served, arrays, Encoded(answer, answer_type), body, body_type)
        capturer.answered(served, arrays, Encoded(answer, answer_type), body, None, body_type)
        # THEN the two lines are the same but for their stamps, and each holds a fresh, valid id
        fast, general = written[-2:]
        assert _STAMPED.sub(b"", fast) == _STAMPED.sub(b"", general)
        record = orjson.loads(fast)
        assert UUID.match(record["eventMetadata"]["eventId"])
        assert record["eventMetadata"]["eventId"] != orjson.loads(general)["eventMetadata"]["eventId"]


def test_requests_to_models_in_turn_each_name_their_own_model() -> None:
    # GIVEN one worker's capturer answering two models and two media types in turn (its last frame then misses)
    from servestack.inference.media_types import Encoded

    written: list[bytes] = []
    capturer = Capturer(CaptureSetting(deployment="d", mode="serverless"), write=written.append)
    first, second = _Model("digits"), _Model("flowers")
    turns: list[tuple[Any, str]] = [(first, "application/json"), (second, "text/csv"), (first, "text/csv")] * 2
    for served, body_type in turns:
        capturer.answered_raw(served, {}, Encoded(b'{"predictions": [1]}', "application/json"), b"1,2", body_type)
    # THEN each line names the model and the body's media type of its own request
    records = records_of(written)
    assert [(r["servestack"]["model"], r["captureData"]["endpointInput"]["observedContentType"]) for r in records] == [
        (served.manifest.name, body_type) for served, body_type in turns
    ]


@given(lengths=st.lists(st.integers(min_value=1, max_value=3 * select.PIPE_BUF), max_size=40))
def test_a_burst_is_cut_into_the_fewest_writes_of_whole_lines_within_pipe_buf(lengths: list[int]) -> None:
    # GIVEN lines of any length waiting for a burst
    lines = [b"x" * (length - 1) + b"\n" for length in lengths]
    writes: list[bytes] = []
    loop = asyncio.new_event_loop()
    try:
        bursts = LineBursts(loop, writes.append, None)
        for line in lines:
            bursts._pending.append(line)
        # WHEN they go out
        bursts.flush()
    finally:
        loop.close()
    # THEN every byte goes out once, in order, each write whole lines within PIPE_BUF (a longer line alone), and a
    # write ends only where the next line would not fit
    assert b"".join(writes) == b"".join(lines)
    for number, write in enumerate(writes):
        assert write.endswith(b"\n")
        assert len(write) <= select.PIPE_BUF or write.count(b"\n") == 1
        if number + 1 < len(writes):
            following = writes[number + 1].split(b"\n", 1)[0] + b"\n"
            assert len(write) + len(following) > select.PIPE_BUF


def test_a_full_pipe_never_stalls_the_loop_and_gets_every_line_once_its_reader_drains_it() -> None:
    # GIVEN lines for a pipe whose reader is not reading: a log driver lagging behind
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, True)
    lines = [b'{"n": %d, "pad": "%s"}\n' % (number, b"p" * 900) for number in range(1600)]  # ~1.5 MB
    received = bytearray()

    async def lagging_reader() -> int:
        loop = asyncio.get_running_loop()
        space = PipeSpace.of(write_end)
        assert space is not None  # a pipe, widened where the system allows
        bursts = LineBursts(loop, lambda data: os.write(write_end, data), space)
        # WHEN more than the pipe holds is added before the reader reads (a write that waited would wait forever
        # here: the reader runs on this loop), then the reader catches up
        for line in lines:
            bursts.add(line)
        bursts.flush()
        kept = len(bursts._carry)
        os.set_blocking(read_end, False)
        while len(received) < sum(map(len, lines)):
            try:
                received.extend(os.read(read_end, 1 << 16))
            except BlockingIOError:
                await asyncio.sleep(0)  # the loop turns: the bursts' retries write the rest
        return kept

    try:
        kept = asyncio.run(lagging_reader())
    finally:
        os.close(read_end)
        os.close(write_end)
    # THEN what the full pipe could not take was kept rather than waited for, and every line arrived once, whole
    # and in order
    assert kept > 0
    assert bytes(received).splitlines(keepends=True) == lines
