"""Texts for a model whose package carries a Hugging Face tokenizer (`models push --tokenizer tokenizer.json`),
with no hook: the request's texts are tokenized into the model's inputs by name.

    text/plain body                                  one text
    {"instances": ["a text", "another", ...]}        a text per row (TF Serving's row form; a batch job's lines)
    {"inputs": ["a text", ...]} or {"inputs": "a text"}   the Hugging Face Inference API's form

Each text is truncated to the model's maximum length (the manifest's `max_length` of `input_ids`, or the graph's
fixed L) and the batch padded to its longest text (or to the fixed L) with the tokenizer's pad id; `input_ids`,
`attention_mask` and `token_type_ids` are filled where the model has them. Ids sent as lists keep the tensor forms
(ragged rows padded with the manifest's pad value). An empty text, or one the tokenizer refuses, is a 400 naming
the item.
"""

from __future__ import annotations

import codecs as text_codecs
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from servestack.inference.errors import InvalidInput, ModelLoadError, short_repr
from servestack.inference.hooks import check_requirements
from servestack.inference.input_checks import validate_inputs
from servestack.inference.manifest import Manifest
from servestack.inference.paths import confined
from servestack.inference.runtime import Arrays

PLAIN_TEXT = "text/plain"
_FORMS = ("instances", "inputs")
_ALLOWED = 'a text/plain body, {"instances": ["text", ...]} or {"inputs": ["text", ...]}'


def texts_of(payload: Any) -> tuple[str, list[Any]] | None:
    """(field, items) of a JSON request that carries texts: `instances` or `inputs` holding a list whose first
    item is a string, or `inputs` holding one string. None for every other request (ids, by-name forms)."""
    if type(payload) is not dict or len(payload) != 1:
        return None
    field, value = next(iter(payload.items()))
    if field not in _FORMS:
        return None
    if field == "inputs" and type(value) is str:
        return field, [value]
    if type(value) is list and value and type(value[0]) is str:
        return field, value
    return None


class TextInputs:
    """A package's tokenizer, set to truncate to the model's maximum length and pad with its pad id."""

    def __init__(self, tokenizer: Any, manifest: Manifest) -> None:
        ids = manifest.sequence_of("input_ids")
        spec = next(spec for spec in manifest.inputs if spec.name == "input_ids")
        fixed = spec.row_shape[0]
        self.max_length = fixed or (ids.max_length if ids is not None else None)
        # The manifest's pad id, read from this tokenizer at push; the batch is padded here, to its longest text or
        # to L where the graph fixes it.
        self.pad = ids.pad if ids is not None and ids.pad is not None else 0
        self.fixed = fixed
        tokenizer.no_padding()
        tokenizer.no_truncation()
        if self.max_length is not None:
            tokenizer.enable_truncation(self.max_length)
        self.tokenizer = tokenizer
        self.manifest = manifest
        self.names = [spec.name for spec in manifest.inputs]

    def from_plain(self, body: bytes, content_type: str, *, max_rows: int) -> Arrays:
        """A `text/plain` body (in its `charset`, UTF-8 by default) as one text."""
        charset = _charset(content_type)
        try:
            text = body.decode(charset)
        except UnicodeDecodeError as error:
            raise InvalidInput(
                f"body: not {charset} text (byte {error.start}: {error.reason})",
                field="body",
                value=short_repr(body[error.start : error.start + 8]),
                allowed=f"text in {charset} (the Content-Type's charset, UTF-8 by default)",
            ) from None
        return self.arrays([text], field="body", max_rows=max_rows)

    def arrays(self, items: Sequence[Any], *, field: str, max_rows: int) -> Arrays:
        """The model's inputs for these texts; `field` names them in errors (`instances[2]`)."""
        if len(items) > max_rows:
            raise InvalidInput(
                f"batch of {len(items)} texts is over the limit",
                field=field,
                value=len(items),
                allowed=f"1..{max_rows} texts",
            )
        # One text at a time, not `encode_batch`: it is no faster on the few cores a function or a container has
        # (bench/tokenizing.py), starts a thread pool in every serving process, and could not name the text it
        # failed on.
        encodings = []
        for index, item in enumerate(items):
            where = field if field == "body" else f"{field}[{index}]"
            if type(item) is not str:
                raise InvalidInput(
                    f"{where}: {short_repr(item)} ({type(item).__name__}) is not a text; every item is a string",
                    field=where,
                    value=item,
                    allowed=_ALLOWED,
                )
            if not item.strip():
                raise InvalidInput(f"{where}: an empty text", field=where, value=item, allowed="a non-empty text")
            try:
                encodings.append(self.tokenizer.encode(item))
            except Exception as error:  # the tokenizer's own errors carry no type of their own
                raise InvalidInput(
                    f"{where}: the tokenizer refused this text ({error})", field=where, value=item, allowed=_ALLOWED
                ) from None
        longest = self.fixed or max(len(encoding.ids) for encoding in encodings)
        input_ids = np.full((len(encodings), longest), self.pad, dtype=np.int64)
        attention_mask = np.zeros((len(encodings), longest), dtype=np.int64)
        token_type_ids = np.zeros((len(encodings), longest), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            length = len(encoding.ids)
            input_ids[row, :length] = encoding.ids
            attention_mask[row, :length] = encoding.attention_mask
            token_type_ids[row, :length] = encoding.type_ids
        arrays = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        arrays = {name: arrays[name] for name in self.names}
        # The checks every input takes (dtype, id range): the tokenizer's ids are the model's only if its vocabulary
        # is the embedding's, which push checks where it can.
        return validate_inputs(
            {name: (field, array) for name, array in arrays.items()}, self.manifest, max_batch_rows=max_rows
        )


def _charset(content_type: str) -> str:
    for parameter in content_type.split(";")[1:]:
        key, _, value = parameter.partition("=")
        if key.strip().lower() == "charset":
            name = value.strip().strip('"')
            try:
                return text_codecs.lookup(name).name
            except LookupError:
                raise InvalidInput(
                    f"Content-Type: charset {name!r} is not known",
                    field="Content-Type",
                    value=name,
                    allowed="a charset such as utf-8 or latin-1",
                ) from None
    return "utf-8"


def load_text_inputs(package_dir: Path, manifest: Manifest) -> TextInputs | None:
    """The package's tokenizer, once its declared requirements (`tokenizers`) are known to be installed; None for
    a package without one."""
    if manifest.tokenizer is None:
        return None
    check_requirements(manifest.requirements, manifest.key)
    from tokenizers import Tokenizer

    path = confined(package_dir, manifest.tokenizer, field="tokenizer")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises plain Exceptions for a file it cannot read
        raise ModelLoadError(f"{path}: not a tokenizer the installed tokenizers reads: {error}") from None
    return TextInputs(tokenizer, manifest)
