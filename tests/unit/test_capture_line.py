"""A capture record's line as bytes (servestack/inference/capture_line.py) against the record as a dict
(`capture_record`, the format of docs/monitoring.md), the event's id and time, and the lines of one loop turn
written together (`Capturer.coalesce`)."""

from __future__ import annotations

import asyncio
import re
import select
from datetime import UTC, datetime

import numpy as np
import orjson
from hypothesis import given
from hypothesis import strategies as st

from servestack.inference.capture import Capturer, CaptureSetting, capture_record, records_of
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


def test_the_inference_time_is_utc_to_the_millisecond_as_isoformat_writes_it() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    written = EventStamps().inference_time().decode()
    after = datetime.now(UTC)

    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", written)
    assert before <= datetime.fromisoformat(written) <= after


def test_the_lines_of_one_loop_turn_are_written_together_in_atomic_writes() -> None:
    writes: list[bytes] = []
    capturer = Capturer(CaptureSetting(deployment="d", mode="realtime"), write=writes.append)
    small = {"x": np.zeros((1, 4), dtype=np.float32)}
    wide = {"x": np.zeros((1, 1000), dtype=np.float32)}  # a line of ~4.3 KB, past PIPE_BUF

    async def one_turn() -> None:
        capturer.coalesce(asyncio.get_running_loop())
        for arrays in (small, small, wide, small):
            capturer.emit(model="m", version="1", columns=(), arrays=arrays, output=b"{}")
        assert writes == []  # the turn goes on: nothing written yet
        turned = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(turned.set_result, None)  # after the flush the first line scheduled
        await turned

    asyncio.run(one_turn())

    assert [write.count(b"\n") for write in writes] == [2, 1, 1]  # whole lines; the wide one alone
    assert all(len(write) <= select.PIPE_BUF for write in writes if write.count(b"\n") > 1)
    assert len(records_of(b"".join(writes).splitlines())) == 4
