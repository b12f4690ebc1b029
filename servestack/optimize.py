"""`servestack models optimize NAME[@VERSION]`: quantize a registry model, measure it, push it if it is good enough.

One run does everything on the user's machine:
1. fetch the source version from the registry;
2. build the optimized model with onnxruntime's own tools: `graph` saves onnxruntime's basic graph
   optimizations offline; `dynamic-int8` and `static-int8` run `onnxruntime.quantization` (static with
   calibration rows from `--calibration` or the package's sample) and then the same graph optimizations;
3. measure accuracy on held-out rows (`--eval`: against their labels when every row has one, else agreement
   with the float model's predictions; without `--eval`, agreement on the package's sample) and speed at
   batch 1 and 32, float and optimized interleaved in the same run;
4. push a new version only if the accuracy drop is within `--max-accuracy-drop` points; its manifest records
   the source version, the method and the figures. Otherwise say why and push nothing.

Rows files are JSON Lines, one row per line as in a request's `"instances"` (the form batch input files
take), or `{"instance": <row>, "label": <class id or label>}`. Rows go through the same decoding as a request
(and the package's `preprocess` hook, if any). Only the offline tools need `onnxruntime.quantization` and
`onnx`; the serving code never imports them (the Lambda bundle strips that package).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the CLI builds its parser from this module: keep onnxruntime out of `--help`
    import numpy as np

    from models.manifest import AccuracyFigures, Manifest, Optimization, SpeedFigures
    from models.registry import ModelRegistry
    from models.service import ServedModel

Method = Literal["graph", "dynamic-int8", "static-int8"]
METHODS: tuple[Method, ...] = ("dynamic-int8", "static-int8", "graph")
LOSSY: frozenset[str] = frozenset({"dynamic-int8", "static-int8"})
SAMPLE_FILE = "sample-request.json"
SPEED_BATCHES = (1, 32)
SPEED_ROUNDS = 7
# Rows decoded per call: well under the serving default of 10,000 rows per request.
CHUNK_ROWS = 1000
# Rows per calibration batch fed to onnxruntime's calibrator.
CALIBRATION_BATCH = 32
DEFAULT_MAX_DROP = "0.5"


@dataclass(frozen=True)
class Rows:
    """Decoded rows: input arrays per chunk, and the label of every row when all rows carry one."""

    source: str
    chunks: list[dict[str, np.ndarray]]
    labels: list[Any] | None

    @property
    def count(self) -> int:
        return sum(len(next(iter(chunk.values()))) for chunk in self.chunks)

    def first(self, rows: int) -> dict[str, np.ndarray]:
        """`rows` rows (the first ones, repeated when there are fewer), as one batch."""
        import numpy as np

        names = list(self.chunks[0])
        joined = {name: np.concatenate([chunk[name] for chunk in self.chunks]) for name in names}
        available = len(joined[names[0]])
        index = np.arange(rows) % available
        return {name: np.ascontiguousarray(values[index]) for name, values in joined.items()}


@dataclass(frozen=True)
class Outcome:
    """What one optimize run measured and decided."""

    source: Manifest
    optimization: Optimization
    holds: bool
    pushed: Manifest | None
    registry_uri: str
    notes: list[str]

    @property
    def reason(self) -> str:
        accuracy = self.optimization.accuracy
        measured = (
            f"{accuracy.measure} on {accuracy.rows:,} rows of {accuracy.source}: float "
            f"{accuracy.float_percent:.2f}%, {self.optimization.method} {accuracy.optimized_percent:.2f}%"
        )
        if self.holds:
            drop, gate = accuracy.drop_points, accuracy.max_drop_points
            return f"gate holds: accuracy drop {drop:.2f} points <= {gate:g} ({measured})"
        return (
            f"refused: the accuracy drop is {accuracy.drop_points:.2f} points ({measured}), over "
            f"--max-accuracy-drop {accuracy.max_drop_points:g}; nothing was pushed"
        )

    def to_dict(self) -> dict[str, Any]:
        import msgspec

        return {
            "source": self.source.key,
            "holds": self.holds,
            "pushed": self.pushed.key if self.pushed else None,
            "registry": self.registry_uri,
            "reason": self.reason,
            "notes": self.notes,
            "optimization": msgspec.to_builtins(self.optimization),
        }


# --------------------------------------------------------------------------------------------- rows


def _invalid(message: str, field: str, value: Any = None, allowed: str | None = None) -> Exception:
    from models.errors import InvalidInput

    return InvalidInput(message, field=field, value=value, allowed=allowed)


ROW_FORM = 'one row per line: [..] (as in "instances") or {"instance": [..], "label": <class>}'


def parse_rows_file(path: Path) -> tuple[list[bytes], list[Any] | None, list[int]]:
    """Each line's row as JSON text, the labels (None when no line has one) and the line numbers."""
    import orjson

    try:
        text = path.read_bytes()
    except OSError as exc:
        raise _invalid(
            f"{path}: {exc.strerror or exc}", field=str(path), allowed="a readable JSON Lines file"
        ) from None
    rows: list[bytes] = []
    labels: list[Any] = []
    numbers: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise _invalid(
                f"{path.name} line {number}: not JSON ({exc})", field=f"{path.name} line {number}", allowed=ROW_FORM
            ) from None
        if isinstance(value, dict) and "instance" in value and set(value) <= {"instance", "label"}:
            rows.append(orjson.dumps(value["instance"]))
            labels.append(value.get("label"))
        else:
            rows.append(line.strip())
            labels.append(None)
        numbers.append(number)
    if not rows:
        raise _invalid(f"{path.name}: no rows", field=path.name, value="empty", allowed=ROW_FORM)
    labelled = [label is not None for label in labels]
    if any(labelled) and not all(labelled):
        missing = numbers[labelled.index(False)]
        raise _invalid(
            f"{path.name} line {missing}: has no label while other lines have one",
            field=f"{path.name} line {missing}",
            allowed="a label on every line (accuracy) or on none (agreement with the float model)",
        )
    return rows, (labels if all(labelled) else None), numbers


def decode_rows(
    model: ServedModel, source: str, rows: list[bytes], numbers: list[int], labels: list[Any] | None
) -> Rows:
    """Rows through the request decoder, in chunks; a bad row is reported with its line number."""
    from models import codecs
    from models.errors import ServingError

    chunks: list[dict[str, np.ndarray]] = []
    for start in range(0, len(rows), CHUNK_ROWS):
        part = rows[start : start + CHUNK_ROWS]
        try:
            chunks.append(model.decode(b'{"instances":[' + b",".join(part) + b"]}", codecs.JSON))
        except ServingError:
            for offset, row in enumerate(part):
                try:
                    model.decode(b'{"instances":[' + row + b"]}", codecs.JSON)
                except ServingError as error:
                    line = numbers[start + offset]
                    raise _invalid(
                        f"{source} line {line}: {error.message}",
                        field=f"{source} line {line}",
                        value=error.value,
                        allowed=error.allowed,
                    ) from None
            raise
    return Rows(source, chunks, labels)


def sample_rows(registry: ModelRegistry, name: str, version: str) -> list[bytes] | None:
    """The rows of the package's `sample-request.json` (`{"instances": [...]}`), if it has one."""
    import orjson

    raw = registry.store.read(f"{registry.prefix}{name}/{version}/{SAMPLE_FILE}")
    if raw is None:
        return None
    try:
        instances = orjson.loads(raw).get("instances")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return [orjson.dumps(row) for row in instances] if isinstance(instances, list) and instances else None


# ----------------------------------------------------------------------------------- building models


def _quiet_session_options() -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # onnxruntime's notes about removed initializers are not the user's concern
    return options


def save_graph_optimized(source: Path, destination: Path) -> None:
    """onnxruntime's *basic* graph optimizations (constant folding, redundant node removal), saved offline.

    Basic rewrites keep standard ONNX operators, so the file runs on every execution provider; the extended
    and layout levels write fused, provider-specific operators, which the serving runtime applies at load
    time anyway (`ORT_ENABLE_ALL`)."""
    import onnxruntime as ort

    options = _quiet_session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(destination)
    ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])


class _CalibrationReader:
    """`onnxruntime.quantization.CalibrationDataReader`: the calibration rows in batches."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self._batches: Iterator[dict[str, np.ndarray]] = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def rewind(self) -> None:  # part of the reader interface; one pass is all the MinMax calibrator takes
        return None


def build_optimized(source: Path, method: Method, workdir: Path, calibration: Rows | None) -> Path:
    """The optimized model file for `method`, written under `workdir`."""
    output = workdir / "model.onnx"
    if method == "graph":
        save_graph_optimized(source, output)
        return output
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quant_pre_process, quantize_dynamic, quantize_static

    # Shape inference only: symbolic inference stops at ai.onnx.ml operators (Scaler, TreeEnsemble...), and
    # onnxruntime's pre-quantization rewrites can drop the Cast whose output type the quantizer needs after
    # such an operator. The graph optimizations run after quantization instead.
    inferred = workdir / "inferred.onnx"
    quant_pre_process(source, inferred, skip_optimization=True, skip_symbolic_shape=True)
    quantized = workdir / "quantized.onnx"
    # Tensors that follow an ai.onnx.ml operator have no inferred type; in these models they are float.
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    if method == "dynamic-int8":
        quantize_dynamic(inferred, quantized, weight_type=QuantType.QInt8, extra_options=extra)
    else:
        if calibration is None:
            raise ValueError("static-int8 needs calibration rows")
        batches = [
            {name: values[start : start + CALIBRATION_BATCH] for name, values in chunk.items()}
            for chunk in calibration.chunks
            for start in range(0, len(next(iter(chunk.values()))), CALIBRATION_BATCH)
        ]
        quantize_static(
            inferred,
            quantized,
            _CalibrationReader(batches),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            extra_options=extra,
        )
    save_graph_optimized(quantized, output)
    return output


def int8_weights(model_path: Path) -> tuple[int, list[str]]:
    """How many weight tensors (more than one element) are stored as int8/uint8, and the graph's operators."""
    import onnx

    model = onnx.load(str(model_path))
    eight_bit = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
    count = sum(1 for t in model.graph.initializer if t.data_type in eight_bit and _elements(t.dims) > 1)
    return count, sorted({node.op_type for node in model.graph.node})


def _elements(dims: Sequence[int]) -> int:
    total = 1
    for size in dims:
        total *= size
    return total


# --------------------------------------------------------------------------------------- measuring


def predictions(model: ServedModel, rows: Rows) -> list[Any]:
    """The primary output of every row, as Python values."""
    import numpy as np

    output = model.manifest.primary_output
    found: list[Any] = []
    for chunk in rows.chunks:
        found.extend(np.asarray(model.predict(chunk)[output]).reshape(-1).tolist())
    return found


def check_classifier(manifest: Manifest) -> None:
    """The gate compares class predictions; a float prediction output (regression) has no accuracy to gate."""
    spec = next(o for o in manifest.outputs if o.name == manifest.primary_output)
    if spec.dtype not in ("int64", "int32", "int8", "uint8", "string", "bool"):
        raise _invalid(
            f"model {manifest.key}: its prediction output {spec.name!r} is {spec.dtype}; the accuracy gate compares "
            f"class predictions",
            field="model",
            value=manifest.key,
            allowed="a classifier whose prediction output holds integer or string classes",
        )


def _normalise_label(label: Any, manifest: Manifest) -> Any:
    """A label as the model predicts it: a label name becomes its class id when the manifest lists labels."""
    if isinstance(label, str) and manifest.labels and label in manifest.labels:
        return manifest.labels.index(label)
    return label


def measure_accuracy(
    float_model: ServedModel, optimized: ServedModel, rows: Rows, max_drop: Fraction
) -> tuple[AccuracyFigures, Fraction]:
    """Percentages as exact fractions until the figures are written: the gate compares exact values."""
    from models.manifest import AccuracyFigures

    reference = predictions(float_model, rows)
    candidate = predictions(optimized, rows)
    total = len(reference)
    if rows.labels is not None:
        expected = [_normalise_label(label, float_model.manifest) for label in rows.labels]
        float_pct = Fraction(100 * sum(p == e for p, e in zip(reference, expected, strict=True)), total)
        optimized_pct = Fraction(100 * sum(p == e for p, e in zip(candidate, expected, strict=True)), total)
        measure: Literal["accuracy", "agreement"] = "accuracy"
    else:
        float_pct = Fraction(100)
        optimized_pct = Fraction(100 * sum(p == r for p, r in zip(candidate, reference, strict=True)), total)
        measure = "agreement"
    drop = float_pct - optimized_pct
    figures = AccuracyFigures(
        measure=measure,
        rows=total,
        source=rows.source,
        float_percent=round(float(float_pct), 4),
        optimized_percent=round(float(optimized_pct), 4),
        drop_points=round(float(drop), 4),
        max_drop_points=float(max_drop),
    )
    return figures, drop


def _calls_per_sec(predict: Callable[[], Any], seconds: float) -> float:
    """Calls per second over `seconds` (at least one call)."""
    calls = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        predict()
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - started)


def measure_speed(float_model: ServedModel, optimized: ServedModel, rows: Rows, seconds: float) -> list[SpeedFigures]:
    """Batch 1 and 32, float and optimized interleaved in short rounds, the fastest round of each reported: load
    from elsewhere on the machine only ever slows a round down, so the fastest is the least disturbed (timeit's
    rule), and interleaving exposes both models to the same conditions."""
    from models.manifest import SpeedFigures

    figures: list[SpeedFigures] = []
    for batch_rows in SPEED_BATCHES:
        batch = rows.first(batch_rows)
        rates: dict[str, list[float]] = {"float": [], "optimized": []}
        for _ in range(SPEED_ROUNDS):
            for label, model in (("float", float_model), ("optimized", optimized)):
                rates[label].append(
                    _calls_per_sec(functools.partial(model.runtime.predict, batch), seconds / SPEED_ROUNDS)
                )
        float_rate, optimized_rate = max(rates["float"]), max(rates["optimized"])
        figures.append(
            SpeedFigures(
                batch_rows=batch_rows,
                float_ms_per_call=round(1000 / float_rate, 4),
                optimized_ms_per_call=round(1000 / optimized_rate, 4),
                float_rows_per_sec=round(float_rate * batch_rows, 1),
                optimized_rows_per_sec=round(optimized_rate * batch_rows, 1),
            )
        )
    return figures


def machine() -> str:
    import onnxruntime as ort

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.machine()}, {cpus} CPUs, onnxruntime {ort.__version__}, 1 intra-op thread"


# ------------------------------------------------------------------------------------------- the run


def parse_max_drop(text: str) -> Fraction:
    """The gate in points, kept exact (0.5 is 1/2, not 0.5000000000000001)."""
    try:
        value = Fraction(Decimal(text.strip()))
    except (InvalidOperation, ValueError):
        value = Fraction(-1)
    if value < 0 or value > 100:
        raise _invalid(
            f"--max-accuracy-drop: {text!r} is not a number of points in 0..100",
            field="--max-accuracy-drop",
            value=text,
            allowed="0..100 (percentage points)",
        )
    return value


def optimize(
    registry: ModelRegistry,
    target: str,
    *,
    method: Method = "dynamic-int8",
    calibration_file: Path | None = None,
    eval_file: Path | None = None,
    max_drop: Fraction = Fraction(1, 2),
    version: str | None = None,
    speed_sec: float = 1.0,
) -> Outcome:
    """The whole command: fetch, build, measure, gate, push. Raises `ServingError`s for the user's mistakes."""
    import msgspec
    import onnxruntime as ort

    from models.errors import RegistryError
    from models.manifest import HOOKS_FILE, Optimization
    from models.packaging import create_package, write_manifest
    from models.registry import check_version
    from models.service import ServedModel
    from models.settings import ServingSettings

    if method not in METHODS:
        raise _invalid(
            f"--method: {method!r} is not a method", field="--method", value=method, allowed=", ".join(METHODS)
        )
    name, _, ref = target.partition("@")
    source_version = registry.resolve(name, ref or None)
    existing = registry.versions(name)
    new_version = version or str(max([int(v) for v in existing if v.isdigit()], default=0) + 1)
    check_version(new_version)
    if new_version in existing:  # versions are immutable: say so before any work, not after measuring
        raise RegistryError(
            f"{name}@{new_version} already exists",
            field="--version",
            value=new_version,
            allowed=f"a version not in {', '.join(existing)}",
        )
    settings = ServingSettings(providers="CPUExecutionProvider", intra_op_threads=1)
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="servestack-optimize-") as scratch:
        work = Path(scratch)
        source_dir = registry.fetch(name, source_version, work / "cache")
        float_model = ServedModel.load(source_dir, settings)
        source = float_model.manifest
        check_classifier(source)
        sample = sample_rows(registry, name, source_version)

        def rows_from(path: Path | None, purpose: str) -> Rows:
            if path is not None:
                lines, labels, numbers = parse_rows_file(path)
                return decode_rows(float_model, path.name, lines, numbers, labels)
            if sample is None:
                raise _invalid(
                    f"{source.key} has no {SAMPLE_FILE} to take {purpose} rows from",
                    field=f"--{purpose}",
                    allowed="a JSON Lines file of rows",
                )
            return decode_rows(float_model, SAMPLE_FILE, sample, list(range(1, len(sample) + 1)), None)

        evaluation = rows_from(eval_file, "eval")
        if eval_file is None:
            notes.append(
                f"no --eval: agreement on the {evaluation.count} rows of {SAMPLE_FILE}, where one disagreement "
                f"costs {100 / evaluation.count:.1f} points; pass --eval rows.jsonl for a real measure"
            )
        calibration = rows_from(calibration_file, "calibration") if method == "static-int8" else None
        if calibration is not None and calibration_file is None:
            notes.append(
                f"calibrated on the {calibration.count} rows of {SAMPLE_FILE}; --calibration gives better ranges"
            )

        built_dir = work / "built"
        built_dir.mkdir()
        built = build_optimized(source_dir / source.file, method, built_dir, calibration)
        weights, operators = int8_weights(built)
        if method in LOSSY and weights == 0:
            notes.append(
                f"nothing was quantized: onnxruntime quantizes MatMul/Gemm/Conv-style weights and this graph has "
                f"{', '.join(operators)}; the new version differs by graph optimizations only"
            )

        package = work / "package"
        hooks = source_dir / HOOKS_FILE
        manifest = create_package(
            built,
            package,
            name=name,
            version=new_version,
            labels=source.labels,
            prediction_output=source.prediction_output,
            probability_output=source.probability_output,
            process_file=hooks if hooks.is_file() else None,
            description=f"{source.description} ({method} of version {source_version})".strip(),
        )
        if (manifest.inputs, manifest.outputs) != (source.inputs, source.outputs):
            raise RegistryError(
                f"{method} changed the model's signature: {manifest.inputs}/{manifest.outputs} instead of "
                f"{source.inputs}/{source.outputs}",
                field="--method",
                value=method,
                allowed="a method that keeps inputs and outputs (try graph)",
            )
        optimized = ServedModel.load(package, settings)

        accuracy, drop = measure_accuracy(float_model, optimized, evaluation, max_drop)
        speed = measure_speed(float_model, optimized, evaluation, speed_sec)
        optimization = Optimization(
            source_version=source_version,
            source_sha256=source.sha256,
            method=method,
            onnxruntime_version=ort.__version__,
            measured_on=machine(),
            int8_weights=weights,
            float_bytes=(source_dir / source.file).stat().st_size,
            optimized_bytes=built.stat().st_size,
            calibration_rows=calibration.count if calibration else None,
            calibration_source=calibration.source if calibration else None,
            accuracy=accuracy,
            speed=tuple(speed),
        )
        holds = drop <= max_drop
        pushed: Manifest | None = None
        if holds:
            manifest = msgspec.structs.replace(
                manifest, optimization=optimization, allow_non_finite=source.allow_non_finite
            )
            write_manifest(package, manifest)
            _write_samples(package, sample, settings)
            pushed = registry.push_package(package).manifest
        return Outcome(source, optimization, holds, pushed, registry.uri, notes)


def _write_samples(package: Path, sample: list[bytes] | None, settings: Any) -> None:
    """The source's sample request, and this version's own answer to it (what smoke tests compare)."""
    if sample is None:
        return
    import orjson

    from models import codecs
    from models.service import ServedModel

    body = b'{"instances":[' + b",".join(sample) + b"]}"
    (package / SAMPLE_FILE).write_bytes(body + b"\n")
    model = ServedModel.load(package, settings)
    fields = model.respond(model.predict(model.decode(body, codecs.JSON)))
    expected = {key: fields[key] for key in ("predictions", "labels") if key in fields}
    (package / "sample-response.json").write_bytes(orjson.dumps(expected, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


# ------------------------------------------------------------------------------------------------ CLI


def render(outcome: Outcome) -> str:
    o = outcome.optimization
    lines = [
        f"{outcome.source.key} -> {o.method}: {o.int8_weights} int8 weight tensor(s), "
        f"{o.float_bytes:,} -> {o.optimized_bytes:,} bytes"
        + (f"; calibrated on {o.calibration_rows} rows of {o.calibration_source}" if o.calibration_rows else ""),
        f"speed ({o.measured_on}; fastest of {SPEED_ROUNDS} interleaved rounds):",
    ]
    for figure in o.speed:
        lines.append(
            f"  batch {figure.batch_rows:>2}: float {figure.float_ms_per_call:.4f} ms/call "
            f"({figure.float_rows_per_sec:,.0f} rows/s), {o.method} {figure.optimized_ms_per_call:.4f} ms/call "
            f"({figure.optimized_rows_per_sec:,.0f} rows/s), "
            f"x{figure.float_ms_per_call / figure.optimized_ms_per_call:.2f}"
        )
    lines.extend(f"note: {note}" for note in outcome.notes)
    lines.append(outcome.reason)
    if outcome.pushed is not None:
        lines.append(f"pushed {outcome.pushed.key} to {outcome.registry_uri} (sha256 {outcome.pushed.sha256})")
        lines.append(f"  serve it with: servestack models promote {outcome.pushed.name} {outcome.pushed.version}")
    elif not outcome.holds and o.method in LOSSY:
        lines.append(
            "  try: --method static-int8 with --calibration rows.jsonl, --method graph (lossless), "
            "or a larger --max-accuracy-drop"
        )
    return "\n".join(lines)


def arguments(parser: argparse.ArgumentParser) -> None:
    """`servestack models optimize`'s own arguments (the registry flags are added with the other models
    commands')."""
    parser.add_argument(
        "target", metavar="NAME[@VERSION]", help="the source model (default version: live, else newest)"
    )
    parser.add_argument("--method", choices=METHODS, default="dynamic-int8", help="default: dynamic-int8")
    parser.add_argument(
        "--calibration", type=Path, default=None, help="static-int8 rows (JSON Lines; default: the sample)"
    )
    parser.add_argument("--eval", type=Path, default=None, help="held-out rows (JSON Lines, labels optional)")
    parser.add_argument(
        "--max-accuracy-drop",
        default=DEFAULT_MAX_DROP,
        help="points of accuracy the new version may lose (default 0.5)",
    )
    parser.add_argument("--version", default=None, help="the new version label (default: the next integer)")
    parser.add_argument("--speed-sec", type=float, default=1.0, help="seconds of timing per model and batch size")
    parser.add_argument("--report", type=Path, default=None, help="also write the outcome as JSON here")


def run(args: argparse.Namespace, registry: Callable[[], ModelRegistry]) -> int:
    """0: pushed; 1: the gate refused (nothing pushed). Bad input raises a ServingError, which the CLI prints
    in one line (exit 2). `registry` opens the one the flags name."""
    from servestack.failures import CommandError

    try:
        import onnx  # noqa: F401 - onnxruntime.quantization needs it; say so before doing any work
    except ImportError:
        raise CommandError("needs the onnx package: pip install 'servestack[client]'") from None
    from servestack.progress import Progress

    with Progress().step(f"models optimize {args.target}", f"{args.method}: quantize, then accuracy and speed"):
        outcome = optimize(
            registry(),
            args.target,
            method=args.method,
            calibration_file=args.calibration,
            eval_file=args.eval,
            max_drop=parse_max_drop(args.max_accuracy_drop),
            version=args.version,
            speed_sec=args.speed_sec,
        )
    print(render(outcome))
    if args.report is not None:
        args.report.write_text(json.dumps(outcome.to_dict(), indent=2) + "\n")
    return 0 if outcome.holds else 1


__all__ = ["METHODS", "Outcome", "arguments", "optimize", "parse_max_drop", "run"]
