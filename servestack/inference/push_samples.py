"""The sample request and response a package carries (`sample-request.json`, `sample-response.json`): the request
built from the model's signature (or given with `--sample`, or a picture for a model that declares an image), and
the answer the package gives it through the pipeline every mode serves it with, so that `local up`'s printed
commands, the Lambda pre-traffic hook and the smoke tests compare like with like."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.manifest import SAMPLE_REQUEST, SAMPLE_RESPONSE, Manifest, TensorSpec

SAMPLE_ROWS = 2


def sample_request_from_signature(
    manifest: Manifest, rows: int = SAMPLE_ROWS, categories: dict[str, str] | None = None
) -> dict[str, Any]:
    """A request every mode accepts: `rows` rows per input, row i filled with i (free dimensions: 1); a string
    input with a known category (`categories`, from the graph's encoders) filled with it, else with ""."""

    def filled(spec: TensorSpec) -> list[Any]:
        shape = (rows, *[size or 1 for size in spec.row_shape])
        if spec.dtype == "string":
            text = (categories or {}).get(spec.name, "")
            return np.full(shape, text, dtype=object).tolist()  # type: ignore[no-any-return]
        values = np.broadcast_to(np.arange(rows).reshape(rows, *[1] * (len(shape) - 1)), shape)
        return values.astype(bool if spec.dtype == "bool" else spec.numpy_dtype).tolist()  # type: ignore[no-any-return]

    if manifest.tokenizer is not None:  # a model of texts: texts, as its users send them
        return {"instances": [f"sample text {row}" for row in range(rows)]}
    if manifest.columns:  # a tabular model: rows by column name, as its users send them
        by_input = {spec.name: filled(spec) for spec in manifest.inputs}
        names = [column.name for column in manifest.columns]
        data = [[by_input[column.input][row][column.index or 0] for column in manifest.columns] for row in range(rows)]
        return {"dataframe_split": {"columns": names, "data": data}}
    if len(manifest.inputs) == 1:
        return {"instances": filled(manifest.inputs[0])}
    return {"inputs": {spec.name: filled(spec) for spec in manifest.inputs}}


def write_samples(
    package_dir: Path,
    manifest: Manifest,
    request: dict[str, Any] | None = None,
    categories: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write the sample request and the response the package gives it (predictions, and labels when the
    manifest has them), through the pipeline every mode uses, so the pre-traffic hook and smoke tests
    compare like with like. Returns the response."""
    from servestack.inference.service import ServedModel
    from servestack.inference.settings import ServingSettings

    body = request if request is not None else sample_request_from_signature(manifest, categories=categories)
    settings = ServingSettings(
        model_dir=package_dir, default_model=manifest.name, providers="CPUExecutionProvider", warmup=False
    )
    served = ServedModel.load(package_dir, settings)
    raw = json.dumps(body).encode()
    try:
        answer = json.loads(served.infer(raw, "application/json", "application/json").body)
    except ServingError as error:
        where = "--sample" if request is not None else "the sample built from the signature"
        hint = "" if request is not None else "; pass --sample rows.json with a request the model accepts"
        raise InvalidInput(
            f"{where}: the model refused it: {error.message}{hint}",
            field="sample",
            value=error.value,
            allowed=error.allowed,
        ) from None
    kept = {key: answer[key] for key in ("predictions", "labels") if key in answer}
    response = kept or {key: value for key, value in answer.items() if key not in ("model", "version")}
    (package_dir / SAMPLE_REQUEST).write_text(json.dumps(body) + "\n", encoding="utf-8")
    (package_dir / SAMPLE_RESPONSE).write_text(json.dumps(response) + "\n", encoding="utf-8")
    return response
