"""docs/deep-learning.md's export blocks are the fixture scripts' own lines (they cannot run here: no torch), so
the page shows the export that made the models the rest of the page serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_docs import parse_blocks

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = "docs/deep-learning.md"
SCRIPTS = {"export_image.py": "cnn.onnx", "export_text.py": "text_classifier.onnx"}


def export_blocks() -> dict[str, str]:
    blocks = parse_blocks((REPO / DOCUMENT).read_text(encoding="utf-8"), DOCUMENT)
    found = {}
    for block in blocks:
        for script in SCRIPTS:
            if block.marker is not None and block.marker.kind == "not-run" and script in block.marker.text:
                found[script] = block.text
    return found


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_an_export_block_is_the_scripts_own_lines(script: str) -> None:
    block = export_blocks()[script]
    source = (REPO / "tests" / "fixtures" / "deep_learning" / script).read_text(encoding="utf-8")
    assert "torch.onnx.export(" in block
    assert block.rstrip("\n") in source, f"{DOCUMENT}'s block for {script} is not in the script as written"
