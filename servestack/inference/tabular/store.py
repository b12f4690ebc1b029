"""Where a batch job reads rows and writes parts: an S3 bucket (servestack/adapters/batch.py), a folder (tests)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    etag: str


class Store(Protocol):
    """The object store of one batch run."""

    def list(self, prefix: str) -> list[StoredObject]: ...

    def blocks(self, key: str) -> Iterator[bytes]:
        """The object's bytes, in order, in pieces of any size (a streamed GET)."""
        ...

    def download(self, key: str, path: Path) -> None:
        """The whole object into a local file (Parquet is read from its footer backwards)."""
        ...

    def get(self, key: str) -> bytes: ...

    def metadata(self, key: str) -> dict[str, str] | None: ...

    def put(self, key: str, body: bytes, metadata: dict[str, str], *, sha256: str | None = None) -> None:
        """Store `body` whole. With `sha256` (hex), a store that can refuses to store a body of another digest
        (S3: the `x-amz-checksum-sha256` it checks), so what the job checked is what is stored."""
        ...

    def delete(self, key: str) -> None: ...
