"""What tokenizing a text costs beside running the model on it, for the text fixture (a WordPiece tokenizer and
a one-layer classifier, tests/fixtures/deep_learning/export_text.py), to choose where texts are tokenized by
measurement: in Python with `tokenizers` (what `models push --tokenizer` serves with), or in the graph with
onnxruntime-extensions' BertTokenizer op.

    .venv/bin/python -m bench.tokenizing                 # tokenizers, the model, the whole served request
    python bench/tokenizing.py --extensions-only         # in an environment with onnxruntime-extensions

It prints microseconds per call and per text (the median of repeated runs, after a warm-up); it never asserts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "deep_learning" / "text"
SENTENCES: list[str] = [entry["text"] for entry in json.loads((FIXTURE / "expected.json").read_text())["sentences"]]
MAX_LENGTH = 24


def median_us(call: Callable[[], Any], repeats: int = 2000) -> float:
    """The median of `repeats` timed calls, in microseconds; the best one is printed beside it (on a shared
    machine the median carries the other processes' load, the best is closer to the call's own cost)."""
    for _ in range(50):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    BEST.append(min(times) / 1000)
    return statistics.median(times) / 1000


BEST: list[float] = []


def best() -> str:
    return f"(best {BEST[-1]:.1f})"


def ids_array(encodings: list[Any]) -> np.ndarray:
    return np.array([encoding.ids for encoding in encodings], np.int64)


def encode_each(tokenizer: Any, batch: list[str]) -> list[Any]:
    return [tokenizer.encode(text) for text in batch]


def texts(count: int) -> list[str]:
    return [SENTENCES[index % len(SENTENCES)] for index in range(count)]


def tokenizers_figures() -> None:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_LENGTH)
    tokenizer.enable_padding(pad_id=0, pad_token=tokenizer.id_to_token(0))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(FIXTURE / "text_classifier.onnx"), options, ["CPUExecutionProvider"])
    for count in (1, 32):
        batch = texts(count)
        encode = median_us(partial(tokenizer.encode_batch, batch))
        encode_best = best()
        each = median_us(partial(encode_each, tokenizer, batch))
        each_best = best()
        encodings = tokenizer.encode_batch(batch)
        feeds = {
            "input_ids": np.array([e.ids for e in encodings], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
        }
        arrays = median_us(partial(ids_array, encodings))
        run = median_us(partial(session.run, None, feeds))
        print(
            f"batch {count:>2}: tokenizers encode_batch {encode:8.1f} us {encode_best} ({encode / count:6.1f} us/text),"
            f" ids to arrays {arrays:6.1f} us, model run {run:8.1f} us {best()} ({run / count:6.1f} us/text)"
        )
        print(
            f"          encode one text at a time (as served) {each:8.1f} us {each_best} ({each / count:6.1f} us/text)"
        )
    one = median_us(lambda: tokenizer.encode(SENTENCES[0]))
    print(f"one text: tokenizers encode {one:.1f} us {best()}")


def served_figures() -> None:
    import tempfile

    from servestack.inference.packaging import create_package
    from servestack.inference.push_sequences import sequence_options
    from servestack.inference.service import ServedModel
    from servestack.inference.settings import ServingSettings

    with tempfile.TemporaryDirectory() as scratch:
        package = Path(scratch) / "sentiment" / "1"
        create_package(
            FIXTURE / "text_classifier.onnx", package, name="sentiment", version="1",
            tokenizer=FIXTURE / "tokenizer.json", sequences=sequence_options([], [f"input_ids={MAX_LENGTH}"], []),
        )  # fmt: skip
        model = ServedModel.load(package, ServingSettings(providers="CPUExecutionProvider", intra_op_threads=1))
        for count in (1, 32):
            batch = texts(count)
            encoded = model.text.tokenizer.encode_batch(batch)  # type: ignore[union-attr]
            by_text = json.dumps({"instances": batch}).encode()
            by_ids = json.dumps(
                {"instances": [{"input_ids": e.ids, "attention_mask": e.attention_mask} for e in encoded]}
            ).encode()
            text_us = median_us(partial(model.infer, by_text, "application/json", None), 500)
            text_best = best()
            ids_us = median_us(partial(model.infer, by_ids, "application/json", None), 500)
            print(
                f"served batch {count:>2}: texts {text_us:8.1f} us {text_best}, the same ids as row objects "
                f"{ids_us:8.1f} us {best()} per request"
            )
        plain = SENTENCES[0].encode()
        plain_us = median_us(partial(model.infer, plain, "text/plain", None), 500)
        print(f"served text/plain one text: {plain_us:.1f} us {best()}")


def extensions_figures() -> None:
    """The tokenizer as a graph of onnxruntime-extensions' BertTokenizer op (one text per run: the op takes one
    text, or a pair), with the same vocabulary, lower-casing, [CLS]/[SEP] and maximum length."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from onnxruntime_extensions import get_library_path

    vocabulary = json.loads((FIXTURE / "tokenizer.json").read_text())["model"]["vocab"]
    lines = "\n".join(token for token, _ in sorted(vocabulary.items(), key=lambda item: item[1]))
    node = helper.make_node(
        "BertTokenizer", ["text"], ["input_ids", "token_type_ids", "attention_mask"], domain="ai.onnx.contrib",
        vocab_file=lines, do_lower_case=1, strip_accents=1, max_length=MAX_LENGTH,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "tokenize",
        [helper.make_tensor_value_info("text", TensorProto.STRING, [None])],
        [helper.make_tensor_value_info(name, TensorProto.INT64, [None]) for name in node.output],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    )
    model.ir_version = 9  # one the installed onnxruntime reads
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.register_custom_ops_library(get_library_path())
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    feed = {"text": np.array([SENTENCES[0]], dtype=object)}
    ids = session.run(None, feed)[0]
    print(f"onnxruntime-extensions BertTokenizer ids {ids.tolist()}")
    run_us = median_us(partial(session.run, None, feed))
    print(f"one text: onnxruntime-extensions BertTokenizer run {run_us:.1f} us {best()}")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return
    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_LENGTH)
    same = [
        session.run(None, {"text": np.array([text], dtype=object)})[0].tolist() == tokenizer.encode(text).ids
        for text in SENTENCES
    ]
    print(f"same ids as tokenizers, sentence by sentence: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extensions-only", action="store_true", help="only the onnxruntime-extensions figures")
    args = parser.parse_args()
    if not args.extensions_only:
        tokenizers_figures()
        served_figures()
    try:
        extensions_figures()
    except ImportError as missing:
        print(f"onnxruntime-extensions: not measured ({missing})")


if __name__ == "__main__":
    main()
