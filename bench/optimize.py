"""`servestack models optimize` on both bundled models, every method: accuracy, size and speed, as a table.

    .venv/bin/python -m bench.optimize [--speed-sec 1.0]

Seeds a directory registry in a temp folder with `digits@1` and `breast-cancer@1` (the packages
`servestack/sample_models.py` writes), writes rows files from the scikit-learn datasets the models were trained on (all
rows, labelled, for accuracy; every 7th row for calibration; for digits also 2,100 blends of two images,
unlabelled, which cross decision boundaries, for agreement), then runs the real CLI once per model and method,
pinned to one core (taskset), and prints what each `--report` says. The bundled models were fitted on every
row, so "accuracy" is on training rows: it measures what quantization changes, not generalization. Each run
passes `--allow-slower`, so that every version is measured to the end and "holds" below is the accuracy gate's;
the speed gate's ratio has a column of its own.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from servestack.local.hosting.processes import REPO_ROOT
from servestack.registry import open_registry, seed

METHODS = ("graph", "dynamic-int8", "static-int8")


def write_rows(path: Path, rows: np.ndarray, labels: np.ndarray | None = None) -> Path:
    with path.open("w") as out:
        for index, row in enumerate(rows.tolist()):
            out.write(json.dumps(row if labels is None else {"instance": row, "label": int(labels[index])}) + "\n")
    return path


def blends(features: np.ndarray, pairs: int = 100, steps: int = 21) -> np.ndarray:
    weights = np.linspace(0, 1, steps, dtype=np.float32)[:, None]
    return np.concatenate([features[i] * (1 - weights) + features[i + 1] * weights for i in range(0, 2 * pairs, 2)])


def optimize(
    registry: Path, target: str, method: str, rows: Path, calibration: Path, speed_sec: float
) -> dict[str, Any]:
    report = registry.parent / "report.json"
    report.unlink(missing_ok=True)
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    command = [
        *pin, sys.executable, "-m", "servestack.cli.main", "models", "optimize", target, "--method", method,
        "--eval", str(rows), "--calibration", str(calibration), "--registry", str(registry),
        "--speed-sec", str(speed_sec), "--report", str(report), "--allow-slower",
    ]  # fmt: skip
    subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    outcome: dict[str, Any] = json.loads(report.read_text())
    return outcome


def main(argv: list[str] | None = None) -> None:
    from sklearn.datasets import load_breast_cancer, load_digits

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speed-sec", type=float, default=1.0, help="timing per model and batch size")
    args = parser.parse_args(argv)
    artifacts = REPO_ROOT / "models" / "artifacts"
    print(
        "| model | method | int8 weights | bytes | accuracy (float -> optimized) | batch 1 ms/call | batch 32 rows/s "
        "| speed gate: time ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    agreement: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-optimize-") as scratch:
        work = Path(scratch)
        registry = work / "registry"
        seed(open_registry(str(registry)), [artifacts / "digits" / "1", artifacts / "breast-cancer" / "1"])
        for name, loader in (("digits", load_digits), ("breast-cancer", load_breast_cancer)):
            data = loader()
            features = data.data.astype(np.float32)
            labelled = write_rows(work / f"{name}-all.jsonl", features, data.target)
            calibration = write_rows(work / f"{name}-calibration.jsonl", features[::7])
            for method in METHODS:
                outcome = optimize(registry, f"{name}@1", method, labelled, calibration, args.speed_sec)
                o = outcome["optimization"]
                acc = o["accuracy"]
                one, thirty_two = o["speed"]
                print(
                    f"| {name} | {method} | {o['int8_weights']} | {o['float_bytes']:,} -> {o['optimized_bytes']:,} | "
                    f"{acc['float_percent']:.2f}% -> {acc['optimized_percent']:.2f}% ({acc['rows']} rows) | "
                    f"{one['float_ms_per_call']:.4f} -> {one['optimized_ms_per_call']:.4f} | "
                    f"{thirty_two['float_rows_per_sec']:,.0f} -> {thirty_two['optimized_rows_per_sec']:,.0f} | "
                    f"{outcome['speed_gate']['ratio']:.2f} |"
                )
            if name == "digits":
                boundary = write_rows(work / "digits-blends.jsonl", blends(features))
                for method in ("dynamic-int8", "static-int8"):
                    outcome = optimize(registry, "digits@1", method, boundary, calibration, args.speed_sec)
                    acc = outcome["optimization"]["accuracy"]
                    agreement.append(
                        f"digits {method}: {acc['optimized_percent']:.2f}% agreement with float on {acc['rows']:,} "
                        f"blended rows (drop {acc['drop_points']:.2f} points; gate 0.5: "
                        f"{'holds' if outcome['holds'] else 'refused'})"
                    )
        print(f"measured on: {o['measured_on']}")
    for line in agreement:
        print(line)


if __name__ == "__main__":
    main()
