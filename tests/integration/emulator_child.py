"""An embedded emulator with an `EmulatorState`, in its own interpreter, driven line by line over stdin.

moto's backends are global to a process, so a test that restores "after a restart" needs a new process, as
`local up` is after a restart. Run as `python -m tests.integration.emulator_child DIRECTORY`; it prints
`@@ {"url": ...}` once the server listens, then answers each command line with one `@@ {json}` line:

    snapshot | save-if-changed | restore | clear | autosave SECONDS | stop | counters | exit
    stall BUCKET KEY   the object's bytes stop after the first chunk: a snapshot copying it never finishes
                       (fault injection for the "killed mid-write" test; moto's buffer stands in for a slow disk)
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from pathlib import Path
from typing import Any

from servestack.local.emulator.moto_server import EmbeddedEmulator
from servestack.local.emulator.moto_stores import CHUNK_BYTES
from servestack.local.emulator.persistence import EmulatorState


class StalledBuffer:
    """A file-like object that yields its first chunk, then blocks forever on the next read."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def seek(self, position: int, whence: int = 0) -> int:
        self.position = position
        return position

    def read(self, size: int = -1) -> bytes:
        if self.position == 0:
            return self.data[: CHUNK_BYTES if size < 0 else size]
        threading.Event().wait()  # never set
        return b""

    def close(self) -> None:
        pass


def reply(value: Any) -> None:
    print("@@ " + json.dumps(value), flush=True)


def main(directory: str) -> None:
    emulator = EmbeddedEmulator()
    state = EmulatorState(Path(directory))
    reply({"url": emulator.url})
    for line in sys.stdin:
        command, *args = line.split()
        if command == "snapshot":
            reply(dataclasses.asdict(state.snapshot()))
        elif command == "save-if-changed":
            saved = state.save_if_changed()
            reply(None if saved is None else dataclasses.asdict(saved))
        elif command == "restore":
            reply(dataclasses.asdict(state.restore()))
        elif command == "clear":
            state.clear()
            reply("cleared")
        elif command == "autosave":
            state.start_autosave(float(args[0]))
            reply("autosaving")
        elif command == "stop":
            state.stop()
            reply("stopped")
        elif command == "counters":
            reply({"checks": state.checks, "writes": state.writes})
        elif command == "stall":
            from moto.s3.models import s3_backends

            key = s3_backends[state.account]["aws"].buckets[args[0]].keys[args[1]]
            key._value_buffer = StalledBuffer(key.value)
            reply("stalled")
        elif command == "exit":
            break
        else:
            reply({"error": f"unknown command {command!r}"})
    emulator.stop()
    reply("bye")


if __name__ == "__main__":
    main(sys.argv[1])
