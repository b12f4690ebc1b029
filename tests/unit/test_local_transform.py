"""How local run-batch cuts an object for Batch Transform (servestack/local/sagemaker/transform.py): mini-batches of
whole
lines up to MaxPayloadInMB, in order; a line longer than the limit fails the job, as it does on SageMaker."""

from __future__ import annotations

import pytest

from servestack.local.sagemaker.transform import TransformFailed, assembled, mini_batches


def test_mini_batches_are_whole_lines_in_order_within_the_limit() -> None:
    # GIVEN an object of 10 lines of 10 bytes (the last without its newline)
    body = b"".join(f"[{i:07d}]\n".encode() for i in range(9)) + b"[0000009]"
    # WHEN it is cut with a 25-byte limit
    pieces = mini_batches(body, 25)
    # THEN each piece is at most 25 bytes of whole lines, and together they are the object, in order
    assert all(len(piece) <= 25 for piece in pieces)
    assert all(piece.endswith(b"\n") for piece in pieces[:-1])
    assert b"".join(pieces) == body
    assert [piece.count(b"[") for piece in pieces] == [2, 2, 2, 2, 2]


def test_a_line_longer_than_the_payload_limit_fails_the_job() -> None:
    # GIVEN a line of 40 bytes / WHEN cut at 25 bytes / THEN the job fails, naming the limit
    with pytest.raises(TransformFailed, match="larger than MaxPayloadInMB"):
        mini_batches(b"[1]\n" + b"[" + b"1," * 19 + b"1]\n", 25)


def test_answers_are_assembled_one_line_after_another() -> None:
    # GIVEN answers with and without their last newline / THEN AssembleWith Line puts each on its own lines
    assert assembled([b'{"a":1}\n', b'{"a":2}', b""]) == b'{"a":1}\n{"a":2}\n'
