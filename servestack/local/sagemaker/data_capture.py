"""SageMaker's own data capture (an endpoint config's `DataCaptureConfig`), as the local router plays it: a
sampled share of the answered requests, each one record of SageMaker's shape (the body as received, the answer
as sent, their content types), written to the emulator's S3 with the endpoint's execution role, at SageMaker's
keys: `<destination>/<endpoint>/<variant>/yyyy/mm/dd/hh/<mm-ss-mmm>-<uuid>.jsonl`.

The records are written by a thread of their own, about once a second (SageMaker writes every few minutes), so
the router's loop never waits on S3; a refused write (a role without `s3:PutObject` on the prefix) is reported
once, as SageMaker's capture would fail in AWS.
"""

from __future__ import annotations

import base64
import logging
import queue
import random
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson

logger = logging.getLogger("servestack.router")
FLUSH_SEC = 1.0


def _part(mode: str, content_type: str, data: bytes, json_types: list[str], csv_types: list[str]) -> dict[str, str]:
    media = content_type.split(";")[0].strip()
    encoding = "JSON" if media in json_types else "CSV" if media in csv_types else "BASE64"
    if encoding != "BASE64":
        try:
            return {"observedContentType": content_type, "mode": mode, "data": data.decode(), "encoding": encoding}
        except UnicodeDecodeError:
            encoding = "BASE64"
    text = base64.b64encode(data).decode("ascii")
    return {"observedContentType": content_type, "mode": mode, "data": text, "encoding": encoding}


class NativeCapture:
    """One endpoint's capture: `observe` each answered request; `close` writes what is left."""

    def __init__(self, endpoint: str, config: dict[str, Any], s3: Any) -> None:
        self.endpoint = endpoint
        self.enabled = bool(config.get("EnableCapture", True))
        self.percent = float(config.get("InitialSamplingPercentage", 0))
        destination = str(config["DestinationS3Uri"]).removeprefix("s3://")
        self.bucket, _, prefix = destination.partition("/")
        self.prefix = prefix.rstrip("/")
        modes = {str(o.get("CaptureMode")) for o in config.get("CaptureOptions", [])}
        self.inputs, self.outputs = "Input" in modes, "Output" in modes
        header = config.get("CaptureContentTypeHeader") or {}
        self.json_types = [str(t) for t in header.get("JsonContentTypes", [])]
        self.csv_types = [str(t) for t in header.get("CsvContentTypes", [])]
        self.s3 = s3  # signing as the endpoint's execution role
        self.random = random.Random()  # noqa: S311 - sampling, not cryptography
        self.records: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        self.refused: str | None = None
        self.written = 0
        self._thread = threading.Thread(target=self._run, name=f"capture-{endpoint}", daemon=True)
        self._thread.start()

    def observe(
        self, variant: str, content_type: str, body: bytes, answer_type: str, answer: bytes, now: datetime | None = None
    ) -> None:
        if not self.enabled or not (self.percent >= 100 or self.random.random() * 100 < self.percent):
            return
        data: dict[str, Any] = {}
        if self.inputs:
            data["endpointInput"] = _part("INPUT", content_type, body, self.json_types, self.csv_types)
        if self.outputs:
            data["endpointOutput"] = _part("OUTPUT", answer_type, answer, self.json_types, self.csv_types)
        when = (now or datetime.now(UTC)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        record = {
            "captureData": data,
            "eventMetadata": {"eventId": str(uuid.uuid4()), "inferenceTime": when},
            "eventVersion": "0",
        }
        self.records.put((variant, orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)))

    def close(self, timeout_sec: float = 5.0) -> None:
        self.records.put(None)
        self._thread.join(timeout=timeout_sec)

    def _run(self) -> None:
        done = False
        while not done:
            batch: dict[str, list[bytes]] = {}
            try:
                item = self.records.get(timeout=FLUSH_SEC)
                while True:
                    if item is None:
                        done = True
                        break
                    batch.setdefault(item[0], []).append(item[1])
                    item = self.records.get_nowait()
            except queue.Empty:
                pass
            for variant, lines in batch.items():
                self._write(variant, lines)

    def _write(self, variant: str, lines: list[bytes]) -> None:
        now = datetime.now(UTC)
        name = f"{now.strftime('%M-%S')}-{now.microsecond // 1000:03d}-{uuid.uuid4()}.jsonl"
        key = f"{self.prefix}/{self.endpoint}/{variant}/{now.strftime('%Y/%m/%d/%H')}/{name}".lstrip("/")
        try:
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"".join(lines))
        except Exception as error:
            if self.refused is None:
                self.refused = str(getattr(error, "response", {}).get("Error", {}).get("Message", error))
                logger.error(
                    "data capture of %s cannot write s3://%s/%s: %s", self.endpoint, self.bucket, key, self.refused
                )
            return
        self.written += len(lines)
