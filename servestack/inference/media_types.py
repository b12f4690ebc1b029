"""The media types of every mode's requests and answers, and their content codings.

Which types a request may carry and an answer may take (JSON, CSV, `.npy`, and the variants a parameter asks
for: CSV with a header row, JSON probabilities keyed by label), how an `Accept` header is negotiated, and how a
`Content-Encoding` is decoded, never past the transport's body limit. The codecs that read and write the
bodies themselves are servestack/inference/codecs.py's.
"""

from __future__ import annotations

import re
import zlib
from typing import NamedTuple

from servestack.inference.errors import InvalidInput, NotAcceptable, PayloadTooLarge, UnsupportedMediaType

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
READABLE_TYPES = (JSON, CSV, NPY)
# The bodies a model that declares an image input reads with no hook (servestack/inference/images.py).
IMAGE_TYPES = ("image/jpeg", "image/png", "image/webp")
MULTIPART = "multipart/form-data"
WRITABLE_TYPES = (JSON, CSV, NPY)
# Variants a parameter asks for (RFC 4180's `header`; ours, `probabilities=by-label`): the request and answer
# types a request carries through every mode (an async job records them), each read or written as its base type.
CSV_HEADER = "text/csv; header=present"
JSON_BY_LABEL = "application/json; probabilities=by-label"
ANSWER_TYPES = (*WRITABLE_TYPES, CSV_HEADER, JSON_BY_LABEL)


class Encoded(NamedTuple):
    """A response body and its media type (a tuple: built for every answer, it costs a tuple's allocation)."""

    body: bytes
    media_type: str


def media_type_of(header: str | None) -> str:
    """`application/json; charset=utf-8` -> `application/json`; a missing header means JSON."""
    if not header:
        return JSON
    return header.split(";", 1)[0].strip().lower() or JSON


def request_type_of(header: str | None) -> str:
    """`media_type_of`, keeping `header=present` of a CSV type: `CSV_HEADER`, whose first row names the columns.
    A type no codec reads keeps all its parameters (`multipart/form-data; boundary=...`, `text/plain;
    charset=latin-1`): its body goes to a `preprocess` hook as bytes, and the hook needs them to read it."""
    media_type = media_type_of(header)
    if media_type == CSV and header is not None and _has_parameter(header, "header", "present"):
        return CSV_HEADER
    if header is not None and media_type not in READABLE_TYPES:
        _, semicolon, parameters = header.partition(";")
        if semicolon and parameters.strip():
            return f"{media_type}; {parameters.strip()}"
    return media_type


OCTET_STREAM = "application/octet-stream"


def guessed_type(name: str) -> str:
    """The media type a file's name suggests, as Python's `mimetypes` guesses it (`.jpg` -> `image/jpeg`, `.wav`
    -> `audio/x-wav`, `.txt` -> `text/plain`); `application/octet-stream` for a name it knows nothing of, and for
    one it reads as compressed (`x.json.gz`): the bytes go as they are, with no Content-Encoding to undo."""
    import mimetypes

    guessed, encoding = mimetypes.guess_type(name, strict=False)
    return guessed if guessed is not None and encoding is None else OCTET_STREAM


def answer_type_of(accept: str | None) -> str:
    """`negotiate`, keeping what a parameter of the chosen type asks for: `text/csv; header=present` (a header
    row naming the columns) -> `CSV_HEADER`; `application/json; probabilities=by-label` -> `JSON_BY_LABEL`."""
    chosen = negotiate(accept)
    if accept is None or ";" not in accept or chosen == NPY:
        return chosen
    for part in accept.split(",")[:MAX_ACCEPT_RANGES]:
        if part.split(";", 1)[0].strip().lower() != chosen:
            continue
        if chosen == CSV and _has_parameter(part, "header", "present"):
            return CSV_HEADER
        if chosen == JSON and _has_parameter(part, "probabilities", "by-label"):
            return JSON_BY_LABEL
    return chosen


def _has_parameter(header: str, name: str, value: str) -> bool:
    for parameter in header.split(";")[1:]:
        key, _, found = parameter.partition("=")
        if key.strip().lower() == name and found.strip().strip('"').lower() == value:
            return True
    return False


_QVALUE = re.compile(r"0(?:\.\d{0,3})?|1(?:\.0{0,3})?")
MAX_ACCEPT_RANGES = 32


def negotiate(accept: str | None) -> str:
    """The type to answer in: the writable type with the highest quality in `Accept` (RFC 9110 12.5.1), the
    earlier-listed one on a tie, JSON first among those a wildcard covers. `q=0` means "not this type"; no
    header means JSON."""
    if not accept or not accept.strip():
        return JSON
    ranges: list[tuple[str, float]] = []
    for part in accept.split(",")[:MAX_ACCEPT_RANGES]:
        media_range, *parameters = part.split(";")
        quality = 1.0
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                value = value.strip()
                quality = float(value) if _QVALUE.fullmatch(value) else 0.0  # a malformed q accepts nothing
        ranges.append((media_range.strip().lower() or "*/*", quality))
    best: tuple[float, int, int] | None = None
    chosen = None
    for preference, media_type in enumerate(WRITABLE_TYPES):
        major = media_type.split("/", 1)[0]
        # The most specific range that matches decides the type's quality (RFC 9110 12.5.1).
        for pattern in (media_type, f"{major}/*", "*/*"):
            matches = [(quality, order) for order, (name, quality) in enumerate(ranges) if name == pattern]
            if matches:
                quality, order = max(matches, key=lambda match: (match[0], -match[1]))
                rank = (quality, -order, -preference)
                if quality > 0 and (best is None or rank > best):
                    best, chosen = rank, media_type
                break
    if chosen is None:
        raise NotAcceptable(
            f"Accept: {accept!r} names no type this server can write",
            field="Accept",
            value=accept,
            allowed=", ".join(WRITABLE_TYPES),
        )
    return chosen


# ---------------------------------------------------------------------------------------------- content coding

CONTENT_CODINGS = ("gzip", "x-gzip", "deflate", "identity")


def decode_content(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo `Content-Encoding` (gzip or deflate, one of them), never producing more than `limit` bytes: a
    small bomb that inflates past the limit is refused with 413 as soon as it does. Anything else is 415."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip() and c.strip().lower() != "identity"]
    if not codings:
        return body
    if len(codings) > 1 or codings[0] not in CONTENT_CODINGS:
        raise UnsupportedMediaType(
            f"Content-Encoding: {encoding!r} is not supported",
            field="Content-Encoding",
            value=encoding,
            allowed="gzip or deflate (one coding), or identity",
        )
    # 47 = 32 + 15: zlib detects a gzip or zlib header itself; raw deflate (no header) is -15.
    wbits = 47 if codings[0] != "deflate" or body[:1] == b"\x78" else -15
    inflater = zlib.decompressobj(wbits)
    try:
        decoded = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(
            f"body: not valid {codings[0]} data ({exc})",
            field="Content-Encoding",
            value=encoding,
            allowed=f"a body compressed with {codings[0]}",
        ) from None
    if len(decoded) > limit:
        raise PayloadTooLarge(
            f"body: decompresses to more than {limit} bytes",
            field="body",
            value=f"> {limit} bytes decoded",
            allowed=f"<= {limit} bytes after decoding",
        )
    if not inflater.eof or inflater.unused_data:
        raise InvalidInput(
            f"body: {codings[0]} data is truncated or followed by other bytes",
            field="Content-Encoding",
            value=encoding,
            allowed=f"one complete {codings[0]} stream",
        )
    return decoded
