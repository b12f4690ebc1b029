"""A Hugging Face tokenizer given to `models push --tokenizer tokenizer.json`: read once at push to check it fits
the model and to take its pad id, then carried as a file of the package, with `tokenizers` among the package's
requirements so every deployment installs it (servestack/inference/text_inputs.py serves with it).

What is checked here rather than at the first request: the file is a tokenizer the installed `tokenizers` reads;
the model's inputs are `input_ids` with `attention_mask` / `token_type_ids` where it has them; the tokenizer has
a pad id (its padding settings', or a `[PAD]` / `<pad>` token), which becomes the manifest's pad value of
`input_ids` (a `--pad` that says otherwise is refused); and its vocabulary fits the ids the model's embedding takes
where the graph says (`ids` of `sequences`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.inference.errors import InvalidInput
from servestack.inference.manifest import TOKENIZED_INPUTS, TensorSpec
from servestack.inference.push_sequences import SequenceOptions

# Pad tokens by their usual spellings (BERT's, T5's and RoBERTa's, GPT-NeoX's), for a tokenizer saved without
# padding settings.
_PAD_TOKENS = ("[PAD]", "<pad>", "<|padding|>")
_FLAG = "--tokenizer"


@dataclass(frozen=True)
class PushedTokenizer:
    """The tokenizer file and what push read from it."""

    path: Path
    pad_id: int | None
    vocabulary: int
    requirement: str


def read_tokenizer(path: Path) -> PushedTokenizer:
    """Read `path` with the installed `tokenizers`; an InvalidInput naming the file when it cannot."""
    if not path.is_file():
        raise InvalidInput(f"{_FLAG} {path}: no such file", field=_FLAG, value=str(path))
    try:
        import tokenizers
    except ImportError:
        raise InvalidInput(
            f"{_FLAG} {path}: reading a tokenizer needs the `tokenizers` package here (pip install tokenizers)",
            field=_FLAG,
            value=str(path),
        ) from None
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises plain Exceptions for a file it cannot parse
        raise InvalidInput(
            f"{_FLAG} {path}: not a Hugging Face tokenizer file ({error})",
            field=_FLAG,
            value=str(path),
            allowed="a tokenizer.json written by tokenizers (Tokenizer.save) or transformers (save_pretrained)",
        ) from None
    major, minor = tokenizers.__version__.split(".")[:2]
    return PushedTokenizer(
        path, _pad_id(tokenizer), tokenizer.get_vocab_size(with_added_tokens=True), f"tokenizers>={major}.{minor}"
    )


def _pad_id(tokenizer: Any) -> int | None:
    padding = tokenizer.padding
    if padding is not None:
        return int(padding["pad_id"])
    for token in _PAD_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return None


def with_tokenizer(
    pushed: PushedTokenizer | None, options: SequenceOptions, inputs: Sequence[TensorSpec]
) -> SequenceOptions:
    """The sequence options with the tokenizer's pad id for `input_ids` and 0 for the masks (ragged rows sent as
    ids pad like the texts do); an InvalidInput when the model's inputs are not the tokenizer's, or when the pad
    id is unknown (no pad token, no `--pad input_ids`) or `--pad input_ids` says another id than the tokenizer's."""
    if pushed is None:
        return options
    names = [spec.name for spec in inputs]
    if "input_ids" not in names or not set(names) <= set(TOKENIZED_INPUTS):
        raise InvalidInput(
            f"{_FLAG}: the model's inputs are {names}; a tokenizer fills input_ids, attention_mask, token_type_ids",
            field=_FLAG,
            value=names,
            allowed="a model whose inputs are input_ids [, attention_mask] [, token_type_ids]",
        )
    for spec in inputs:
        if len(spec.row_shape) != 1 or not spec.dtype.startswith(("int", "uint")):
            raise InvalidInput(
                f"{_FLAG}: input {spec.name!r} is {spec.dtype} {list(spec.shape)}; a tokenizer fills integer [N, L]",
                field=_FLAG,
                value=spec.name,
                allowed="integer inputs of shape [N, L]",
            )
    pad: dict[str, int] = {name: 0 for name in names if name != "input_ids"}
    pad.update(options.pad)
    given = options.pad.get("input_ids")
    if given is not None and pushed.pad_id is not None and given != pushed.pad_id:
        raise InvalidInput(
            f"--pad input_ids={given}: the tokenizer pads with id {pushed.pad_id}",
            field="--pad",
            value=given,
            allowed=f"input_ids={pushed.pad_id} (or leave --pad out: the tokenizer's is taken)",
        )
    chosen = given if given is not None else pushed.pad_id
    if chosen is None:
        raise InvalidInput(
            f"{_FLAG} {pushed.path}: the tokenizer has no pad token (no padding settings, none of {list(_PAD_TOKENS)})",
            field=_FLAG,
            value=str(pushed.path),
            allowed="a tokenizer with a pad token, or --pad input_ids=ID",
        )
    pad["input_ids"] = chosen
    return SequenceOptions(pad=pad, max_length=options.max_length, ids=options.ids)


def check_vocabulary(pushed: PushedTokenizer | None, sequences: Sequence[Mapping[str, Any]]) -> None:
    """The tokenizer's ids fit the model's embedding, where the manifest knows its size (`ids` of `input_ids`)."""
    if pushed is None:
        return
    entry = next((entry for entry in sequences if entry["input"] == "input_ids"), None)
    ids = entry.get("ids") if entry is not None else None
    if ids is not None and pushed.vocabulary > ids[1]:
        raise InvalidInput(
            f"{_FLAG} {pushed.path}: the tokenizer has {pushed.vocabulary} ids, but the model's input_ids take "
            f"{ids[0]}..{ids[1] - 1}",
            field=_FLAG,
            value=pushed.vocabulary,
            allowed=f"a tokenizer of at most {ids[1]} ids (the model's embedding rows)",
        )
