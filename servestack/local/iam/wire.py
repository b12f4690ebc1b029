"""The request as it came over the wire (replies are servestack.local.hosting.http_server.Reply: status, headers,
body)."""

from __future__ import annotations

import gzip
import urllib.parse
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class HttpRequest:
    """One HTTP request to an AWS endpoint, before any decoding: `raw_path` and `raw_query` exactly as sent
    (percent-encoded, as SigV4 signs them), header names lower-cased."""

    method: str
    raw_path: str
    raw_query: str
    headers: Mapping[str, str]
    body: bytes = b""
    source_ip: str = "127.0.0.1"

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @cached_property
    def path(self) -> str:
        """The path, percent-decoded."""
        return urllib.parse.unquote(self.raw_path)

    @cached_property
    def content(self) -> bytes:
        """The body with any `Content-Encoding: gzip` undone (botocore compresses CloudWatch PutMetricData)."""
        if "gzip" in (self.header("content-encoding") or "").lower():
            try:
                return gzip.decompress(self.body)
            except (OSError, EOFError, zlib.error):
                return self.body
        return self.body

    @cached_property
    def query(self) -> dict[str, str]:
        """Query parameters, decoded (the last value of a repeated name; `?versions` gives `{"versions": ""}`)."""
        return {key: values[-1] for key, values in self.query_lists.items()}

    @cached_property
    def query_lists(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self.raw_query, keep_blank_values=True)

    @cached_property
    def form(self) -> dict[str, str]:
        """The form-encoded body of a query-protocol call (`Action=Publish&TopicArn=...`), merged over the
        query string (the protocol allows either)."""
        params = dict(self.query)
        content_type = (self.header("content-type") or "").lower()
        if self.body and content_type.startswith("application/x-www-form-urlencoded"):
            try:
                text = self.content.decode("utf-8")
            except UnicodeDecodeError:
                return params
            params.update(
                {key: values[-1] for key, values in urllib.parse.parse_qs(text, keep_blank_values=True).items()}
            )
        return params
