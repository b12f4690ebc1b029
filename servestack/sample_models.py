"""Rebuild the bundled model artifacts from data that ships inside scikit-learn (no downloads).

    python -m servestack.sample_models [--out models/artifacts]

`digits`: a scaled MLP on `load_digits` (64 float32 features -> 10 classes).
`breast-cancer`: gradient boosting on `load_breast_cancer` (30 features -> 2 classes).
Training is seeded, so a rebuild reproduces the same predictions. Needs the dev dependencies
(scikit-learn, skl2onnx), never the serving runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servestack.inference.manifest import read_manifest
from servestack.inference.packaging import create_package
from servestack.inference.runtime import ModelRuntime

SAMPLE_ROWS = 4


@dataclass(frozen=True)
class Recipe:
    name: str
    version: str
    description: str
    train: Callable[[], tuple[Any, np.ndarray, np.ndarray, list[str]]]


def train_digits() -> tuple[Any, np.ndarray, np.ndarray, list[str]]:
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    data = load_digits()
    features = data.data.astype(np.float32)
    estimator = make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(64,), max_iter=400, random_state=0))
    estimator.fit(features, data.target)
    return estimator, features, data.target, [str(name) for name in data.target_names]


def train_breast_cancer() -> tuple[Any, np.ndarray, np.ndarray, list[str]]:
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import GradientBoostingClassifier

    data = load_breast_cancer()
    features = data.data.astype(np.float32)
    estimator = GradientBoostingClassifier(n_estimators=50, max_depth=3, random_state=0)
    estimator.fit(features, data.target)
    return estimator, features, data.target, [str(name) for name in data.target_names]


RECIPES = {
    "digits": Recipe("digits", "1", "MLP on scikit-learn's 8x8 digits; 64 pixel intensities 0..16", train_digits),
    "breast-cancer": Recipe(
        "breast-cancer",
        "1",
        "Gradient boosting on scikit-learn's breast cancer data; 30 features",
        train_breast_cancer,
    ),
}


def train(recipe: Recipe) -> tuple[Any, np.ndarray, np.ndarray, list[str]]:
    """Train single-threaded: BLAS splits sums across threads as load allows, which changes the last bits
    of the weights from one build to the next; one thread makes a rebuild byte-identical."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return recipe.train()


def to_onnx(estimator: Any, n_features: int) -> bytes:
    from skl2onnx import to_onnx as convert
    from skl2onnx.common.data_types import FloatTensorType

    model = convert(
        estimator,
        initial_types=[("input", FloatTensorType([None, n_features]))],
        options={"zipmap": False},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    # Strip the producer version so a rebuild with a newer skl2onnx differs only where the graph does.
    model.producer_version = ""
    return bytes(model.SerializeToString())


def build(recipe: Recipe, root: Path) -> Path:
    estimator, features, _target, labels = train(recipe)
    destination = root / recipe.name / recipe.version
    with tempfile.TemporaryDirectory() as scratch:
        onnx_path = Path(scratch) / "model.onnx"
        onnx_path.write_bytes(to_onnx(estimator, features.shape[1]))
        manifest = create_package(
            onnx_path,
            destination,
            name=recipe.name,
            version=recipe.version,
            labels=labels,
            description=recipe.description,
        )
    runtime = ModelRuntime(read_manifest(destination), destination / manifest.file, providers="CPUExecutionProvider")
    sample = features[:SAMPLE_ROWS]
    predicted = runtime.predict({"input": sample})["label"]
    (destination / "sample-request.json").write_text(json.dumps({"instances": sample.tolist()}) + "\n")
    (destination / "sample-response.json").write_text(
        json.dumps({"predictions": predicted.tolist(), "labels": [labels[i] for i in predicted]}) + "\n"
    )
    return destination


def build_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a reproducible build runs in.

    - skl2onnx's tree converter walks sets, so node order in the ONNX graph follows the hash seed: it is 0.
    - The MLP's weights follow the rounding of the BLAS kernels that train it: OpenBLAS's AVX-512 kernels
      (`SkylakeX`, picked on AVX-512 machines) and its AVX2 ones (`Haswell`, picked on the others) give weights
      that differ in the last bits, and the probabilities by up to 1e-4. The committed packages were built with
      the AVX2 kernels, which every x86-64 machine of the last decade runs, so the build asks for them there
      (unless the environment already names a kernel)."""
    env = dict(os.environ if environ is None else environ)
    env["PYTHONHASHSEED"] = "0"
    if platform.machine() in ("x86_64", "AMD64"):
        env.setdefault("OPENBLAS_CORETYPE", "Haswell")
    return env


def main(argv: list[str] | None = None) -> None:
    wanted = build_environment()
    if any(os.environ.get(k) != v for k, v in wanted.items()):
        os.execve(  # noqa: S606 - re-running ourselves in the build's environment, no shell involved
            sys.executable, [sys.executable, "-m", "servestack.sample_models", *(argv or sys.argv[1:])], wanted
        )
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", type=Path, default=Path("models") / "artifacts", help="artifact root (default: models/artifacts)"
    )
    parser.add_argument("names", nargs="*", choices=[*RECIPES, []], help="models to build (default: all)")
    args = parser.parse_args(argv)
    for name in args.names or RECIPES:
        print(f"built {build(RECIPES[name], args.out)}")


if __name__ == "__main__":
    main()
