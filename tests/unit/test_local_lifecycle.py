"""Pieces of local mode's lifecycle: children's log files and `local logs`, the release kept across restarts,
the merge of a batch run's output, synth's reuse decision, and children that fail to start."""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from servestack.failures import CommandError, ExitCode
from servestack.local import logs
from servestack.local.batch import data as batch_data
from servestack.local.cloudformation.synth import REUSED, _reason, changed_inputs, digest_of, input_files
from servestack.local.commands import lifecycle
from servestack.local.emulator import state
from servestack.local.hosting.processes import free_port
from servestack.local.sagemaker import releases
from servestack.local.up.children import Child
from servestack.local.up.command import _port
from servestack.progress import Progress
from tests.waiting import DEADLINE_SEC, wait_for

# ------------------------------------------------------------------------------------------ logs


def write_log(path: Path, lines: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{at} {text}\n" for at, text in lines))


def test_logs_of_one_deployment_in_time_order_with_since_and_tail(tmp_path: Path) -> None:
    write_log(
        logs.child_log(tmp_path, "api/fn"), [("2026-12-01T10:00:00.000Z", "a1"), ("2026-12-01T10:00:02.000Z", "a2")]
    )
    write_log(logs.child_log(tmp_path, "api/endpoint"), [("2026-12-01T10:00:01.000Z", "e1")])
    write_log(logs.child_log(tmp_path, "other/fn"), [("2026-12-01T10:00:01.500Z", "o1")])
    out = io.StringIO()
    logs.show(tmp_path, "api", out=out)
    assert out.getvalue().splitlines() == ["[api/fn] a1", "[api/endpoint] e1", "[api/fn] a2"]
    out = io.StringIO()
    logs.show(tmp_path, None, since=datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC), tail=2, timestamps=True, out=out)
    assert out.getvalue().splitlines() == [
        "2026-12-01T10:00:01.500Z [other/fn] o1",
        "2026-12-01T10:00:02.000Z [api/fn] a2",
    ]


class Terminal(io.StringIO):
    """What `local logs -f` prints to, watched by a user who presses Ctrl-C once `last` is shown (Ctrl-C is how
    following ends)."""

    def __init__(self, last: str) -> None:
        super().__init__()
        self.last = last

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.last in text:
            raise KeyboardInterrupt
        return written


def test_follow_prints_lines_written_later_and_a_new_runs_file_from_its_start(tmp_path: Path) -> None:
    # GIVEN a child's log holding one line
    path = logs.start_fresh(logs.child_log(tmp_path, "api/fn"))
    sink = logs.LineLog(path)
    sink.write("before")
    out = Terminal(last="[api/fn] after")

    def later() -> None:
        wait_for(lambda: "[api/fn] before" in out.getvalue(), "logs -f to print the line already there")
        sink.write("after")
        sink.close()

    # WHEN `local logs -f` runs, and the child writes a line once the ones already there are printed
    writer = threading.Thread(target=later)
    writer.start()
    logs.show(tmp_path, "api", follow=True, out=out, poll_sec=0.05, follow_for_sec=DEADLINE_SEC)
    writer.join()
    # THEN the later line is printed after the first (and the user's Ctrl-C ended it)
    assert out.getvalue().splitlines() == ["[api/fn] before", "[api/fn] after"]
    # AND a new local up keeps the previous run's file once
    logs.start_fresh(path)
    assert path.read_text() == ""
    assert "after" in path.with_name("fn.log.1").read_text()


def test_since_takes_durations_and_times_and_names_what_it_takes() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert logs.parse_since("10m", now) == datetime(2026, 12, 1, 11, 50, tzinfo=UTC)
    assert logs.parse_since("2026-12-01T11:00:00", now) == datetime(2026, 12, 1, 11, 0, tzinfo=UTC)
    with pytest.raises(CommandError, match=r"--since: 'yesterday' is neither a duration \(30s, 10m"):
        logs.parse_since("yesterday", now)


def test_an_unknown_deployment_is_not_found_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match=r"nope: not a deployment of this project \(api, batch\)") as caught:
        logs.check_deployment(tmp_path, "nope", ["api", "batch"])
    assert caught.value.code == ExitCode.NOT_FOUND


# ------------------------------------------------------------------------------------------ releases


def test_a_recorded_release_replaces_the_templates_version_and_says_so(tmp_path: Path) -> None:
    releases.record(tmp_path, "digits-rt", None, "digits", "2", "1")
    variant = {"name": "primary", "model": "digits", "version": "1", "package_dir": "/extracted", "component": None}
    notices: list[str] = []
    fetched = tmp_path / "packages" / "digits" / "2"
    applied = releases.apply(tmp_path, "digits-rt", variant, lambda m, v: fetched, notices)
    assert (applied["version"], applied["package_dir"]) == ("2", str(fetched))
    (notice,) = notices
    assert notice.startswith("digits-rt: serving version 2 (from local deploy at ")
    assert notice.endswith("; serving.yaml pins 1)")
    # AND a deployment whose template pins the released version, or another one, is left alone
    assert releases.apply(tmp_path, "digits-rt", {**variant, "version": "2"}, lambda m, v: fetched, []) == {
        **variant,
        "version": "2",
    }
    assert releases.apply(tmp_path, "other", variant, lambda m, v: fetched, []) == variant


def test_serving_yaml_wins_once_it_pins_another_version_and_chained_releases_keep_the_first_pin(
    tmp_path: Path,
) -> None:
    # GIVEN version 2 then 3 released over serving.yaml's 1
    releases.record(tmp_path, "digits-rt", None, "digits", "2", "1")
    releases.record(tmp_path, "digits-rt", None, "digits", "3", "2")
    variant = {"name": "primary", "model": "digits", "version": "1", "package_dir": "/x", "component": None}
    notices: list[str] = []
    # THEN while serving.yaml pins 1, version 3 is served
    applied = releases.apply(tmp_path, "digits-rt", variant, lambda m, v: tmp_path / v, notices)
    assert applied["version"] == "3"
    # WHEN serving.yaml pins 4 THEN 4 is served, and local up says why the release no longer applies
    pinned_4 = {**variant, "version": "4"}
    assert releases.apply(tmp_path, "digits-rt", pinned_4, lambda m, v: tmp_path / v, notices) == pinned_4
    assert notices[-1].startswith("digits-rt: serving version 4 as serving.yaml pins it now; the local deploy of ")
    assert "was made over version 1 and no longer applies" in notices[-1]


def test_a_release_the_registry_lost_is_reported_and_the_pinned_version_served(tmp_path: Path) -> None:
    releases.record(tmp_path, "digits-rt", None, "digits", "2", "1")
    variant = {"name": "primary", "model": "digits", "version": "1", "package_dir": "/x", "component": None}

    def gone(model: str, version: str) -> Path:
        raise FileNotFoundError(f"{model}@{version}")

    notices: list[str] = []
    assert releases.apply(tmp_path, "digits-rt", variant, gone, notices) == variant
    assert "serving version 1 as serving.yaml pins it" in notices[0]


# ------------------------------------------------------------------------------------------ batch download


class FakeS3:
    """The one call the merge makes, on a dict of objects."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803 - boto3's names
        return {"Body": io.BytesIO(self.objects[f"{Bucket}/{Key}"])}


def test_the_download_merges_parts_and_errors_in_input_order_joined_to_ids(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet_part = io.BytesIO()
    pq.write_table(pa.table({"file": ["in/b.csv"], "line": [2], "prediction": [7]}), parquet_part)
    manifest = {
        "run": "r1",
        "inputs": [{"key": "in/a.jsonl"}, {"key": "in/b.csv"}],
        "parts": [{"key": "parts/part-00000.jsonl"}, {"key": "parts/part-00001.parquet"}],
        "errors": {"key": "errors.jsonl"},
    }
    part = b'{"file":"in/a.jsonl","line":3,"prediction":5}\n{"file":"in/a.jsonl","line":1,"prediction":4}\n'
    objects = {
        "b/out/manifest.json": json.dumps(manifest).encode(),
        "b/out/manifests/r1.json": json.dumps(manifest).encode(),
        "b/out/parts/part-00000.jsonl": part,
        "b/out/parts/part-00001.parquet": parquet_part.getvalue(),
        "b/out/errors.jsonl": b'{"file":"in/a.jsonl","line":2,"error":{"type":"InvalidInput"}}\n',
        "b/in/a.jsonl": b'{"id": "x1", "values": [1]}\n[1, 2]\n{"id": "x3", "values": [3]}\n',
        "b/in/b.csv": b"id,f1\nrow-b,0.5\n",
    }
    rows = batch_data.merged_rows(FakeS3(objects), "s3://b/out/manifest.json")
    assert [(r["id"], r["file"], r["line"], r["prediction"], r["error"]) for r in rows] == [
        ("x1", "in/a.jsonl", 1, 4, None),
        (None, "in/a.jsonl", 2, None, {"type": "InvalidInput"}),
        ("x3", "in/a.jsonl", 3, 5, None),
        ("row-b", "in/b.csv", 2, 7, None),
    ]
    for suffix in (".jsonl", ".csv", ".parquet"):
        target = tmp_path / f"out{suffix}"
        batch_data.write_rows(rows, target)
        assert target.stat().st_size > 0
    assert (tmp_path / "out.csv").read_text().splitlines() == [
        "id,file,line,prediction,error",
        "x1,in/a.jsonl,1,4,",
        ',in/a.jsonl,2,,"{""type"": ""InvalidInput""}"',
        "x3,in/a.jsonl,3,5,",
        "row-b,in/b.csv,2,7,",
    ]
    assert [json.loads(line)["id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()] == [
        "x1",
        None,
        "x3",
        "row-b",
    ]
    assert pq.read_table(tmp_path / "out.parquet").column("id").to_pylist() == ["x1", None, "x3", "row-b"]


def test_a_download_name_must_say_its_format() -> None:
    with pytest.raises(CommandError, match=r"--download out.xlsx: the suffix says the format; use one of \.csv"):
        batch_data.download_format(Path("out.xlsx"))


# ------------------------------------------------------------------------------------------ synth's decision


def test_synth_says_why_it_runs_and_which_inputs_changed(tmp_path: Path) -> None:
    spec = tmp_path / "serving.yaml"
    spec.write_text("models: []\n")
    (tmp_path / "app.py").write_text("print('app')\n")
    out = tmp_path / "cdk.out"
    marker = out / "servestack-inputs.sha256"
    files = input_files(tmp_path, spec)
    assert _reason(out, marker, files, digest_of(files), tmp_path, force=False).endswith("no earlier synth in cdk.out")
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    marker.write_text(digest_of(files) + "\n")
    (out / "servestack-inputs.json").write_text(json.dumps(files))
    assert _reason(out, marker, files, digest_of(files), tmp_path, force=False) == REUSED
    assert _reason(out, marker, files, digest_of(files), tmp_path, force=True) == "synthesizing: --resynth"
    spec.write_text("models: [] # changed\n")
    now = input_files(tmp_path, spec)
    assert _reason(out, marker, now, digest_of(now), tmp_path, force=False) == "synthesizing: serving.yaml changed"
    package = {str(tmp_path / f"models/artifacts/m/2/{n}"): "00" for n in ("a", "b")}
    assert changed_inputs({}, package | {str(tmp_path / "models/artifacts/m/2.tar.gz"): "00"}, tmp_path) == (
        "models/artifacts/m/2 changed"
    )


# ------------------------------------------------------------------------------------------ children starting


def test_a_child_that_fails_to_start_is_reported_with_its_log_and_the_others_run(tmp_path: Path) -> None:
    port = free_port()
    serving = Child("api/fn", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], {},
                    f"http://127.0.0.1:{port}/")  # fmt: skip
    failing = Child("batch/fn", [sys.executable, "-c", "print('no model here', flush=True); raise SystemExit(3)"],
                    {}, "http://127.0.0.1:9/")  # fmt: skip
    for child in (serving, failing):
        child.log_path = logs.start_fresh(logs.child_log(tmp_path, child.name))
    notices: list[str] = []
    out = io.StringIO()
    try:
        lifecycle.start_children([serving, failing], Progress(out), notices, timeout_sec=60)
        assert serving.process.poll() is None
        assert serving.ready()
    finally:
        serving.stop()
        failing.stop()
    (notice,) = notices
    assert notice.startswith("batch/fn: failed to start: exited with code 3 while starting; the others keep running.")
    assert notice.rstrip().endswith("no model here")
    assert notice.splitlines()[0] in out.getvalue()
    assert "children starting: 1/2 ready, 1 failed (" in out.getvalue()
    deployments: dict[str, dict[str, Any]] = {"api": {"mode": "serverless"}, "batch": {"mode": "batch"}}
    lifecycle.child_processes([serving, failing], deployments)
    assert deployments["api"]["processes"]["api/fn"]["ready_url"] == f"http://127.0.0.1:{port}/"


def test_a_failed_childs_notice_waits_for_its_last_lines_to_reach_the_log(tmp_path: Path) -> None:
    # GIVEN a child that says two lines and exits at once, whose output reaches its log slowly (its first line's
    # other sink takes 0.5 s, as a busy machine can take to schedule the output pump after the exit is seen)
    def slow_sink(line: str) -> None:
        if line == "loading":
            time.sleep(0.5)

    failing = Child("batch/fn", [sys.executable, "-c", "print('loading'); print('no model here')"], {},
                    "http://127.0.0.1:9/", sinks=[slow_sink])  # fmt: skip
    failing.log_path = logs.start_fresh(logs.child_log(tmp_path, failing.name))
    notices: list[str] = []
    try:
        # WHEN local up sees it exit while starting
        lifecycle.start_children([failing], Progress(io.StringIO()), notices, timeout_sec=60)
    finally:
        failing.stop()
    # THEN its notice ends with the last thing it said, not with what had reached the log when the exit was seen
    (notice,) = notices
    assert notice.rstrip().endswith("no model here"), notice


def test_a_taken_default_port_moves_and_is_announced() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        notices: list[str] = []
        moved = _port(None, port, "--port", notices=notices)
    assert moved != port
    assert notices == [f"port {port} is taken: using {moved} instead (pass --port N to choose one)"]


# ------------------------------------------------------------------------------------------ down


def test_down_stops_the_process_behind_the_state_file_and_then_has_nothing_to_stop(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    state_file = tmp_path / "local.json"
    state.write(state_file, {"pid": process.pid}, {})
    try:
        # WHEN local down runs THEN it returns once the process is gone (here a zombie until this test reaps it)
        assert lifecycle.down(state_file, timeout_sec=20) == 0
        assert process.wait(timeout=5) == -signal.SIGTERM
    finally:
        process.kill()
        process.wait()
    # AND a second one finds nothing running, and says so without failing
    assert lifecycle.down(state_file, timeout_sec=5) == 0
