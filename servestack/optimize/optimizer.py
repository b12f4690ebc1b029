"""`servestack models optimize NAME[@VERSION]`: quantize a registry model, measure it, push it if it is good enough.

One run does everything on the user's machine:
1. fetch the source version from the registry;
2. build the optimized model with onnxruntime's own tools: `graph` saves onnxruntime's basic graph
   optimizations offline; `dynamic-int8` and `static-int8` run `onnxruntime.quantization` (static with
   calibration rows from `--calibration` or the package's sample) and then the same graph optimizations;
3. measure the optimized model against the float one on held-out rows (`--eval`, else the package's sample,
   in whatever form it was written) and speed at batch 1 and 32, float and optimized interleaved in the same
   run (servestack/optimize/speed.py);
4. push a new version only if both gates hold. The answers' gate (servestack/optimize/gates.py): for a
   classifier, the accuracy drop is within `--max-accuracy-drop` points; for a regressor, every value is within
   `--max-abs-error` / `--max-rel-error` of the float model's. The speed gate: on the eval rows, the optimized
   model takes at most 1.10x the float model's time per call (median of interleaved pairs), unless
   `--allow-slower`. Its manifest records the source version, the method and the figures. Otherwise say why
   and push nothing. `--method graph` changes no answer and runs on every model.

Rows files and the sample: servestack/optimize/rows.py. Only the offline tools need `onnxruntime.quantization`
and `onnx`; the serving code never imports them (the Lambda bundle strips that package).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servestack.optimize.build import LOSSY, METHODS, Method, build_optimized, int8_weights
from servestack.optimize.gates import (
    DEFAULT_MAX_ABS_ERROR,
    DEFAULT_MAX_DROP,
    DEFAULT_MAX_REL_ERROR,
    Tolerance,
    ToleranceFigures,
    gate_of,
    measure_accuracy,
    measure_tolerance,
    parse_max_drop,
)
from servestack.optimize.rows import (
    SAMPLE_FILE,
    Rows,
    decode_rows,
    decode_sample,
    invalid,
    parse_rows_file,
    sample_request,
)
from servestack.optimize.speed import MAX_SPEED_RATIO, SPEED_ROUNDS, SpeedGate, measure_speed, measure_speed_gate

if TYPE_CHECKING:  # the CLI builds its parser from this module: keep onnxruntime out of `--help`
    from servestack.inference.manifest import Manifest, Optimization
    from servestack.inference.registry import ModelRegistry

DEFAULT_TOLERANCE = Tolerance(float(DEFAULT_MAX_ABS_ERROR), float(DEFAULT_MAX_REL_ERROR))


@dataclass(frozen=True)
class Outcome:
    """What one optimize run measured and decided; `tolerance` is set for a regressor (the tolerance gate).
    `answers_hold`: the accuracy or tolerance gate; `holds`: that one and the speed gate."""

    source: Manifest
    optimization: Optimization
    answers_hold: bool
    speed: SpeedGate
    pushed: Manifest | None
    registry_uri: str
    notes: list[str]
    tolerance: ToleranceFigures | None = None

    @property
    def holds(self) -> bool:
        return self.answers_hold and self.speed.holds

    @property
    def reason(self) -> str:
        """Why it was pushed or not: the answers' gate refuses first; else the speed gate decides."""
        if not self.answers_hold or self.speed.holds:
            return self._answers_reason()
        return (
            f"refused: {self.optimization.method} takes {self.speed.ratio:.2f}x the float model's time per call, "
            f"over the speed gate's {self.speed.max_ratio:.2f}x; the answers' {self._answers_reason()}; nothing "
            "was pushed"
        )

    def _answers_reason(self) -> str:
        if self.tolerance is not None:
            return self._tolerance_reason(self.tolerance)
        accuracy = self.optimization.accuracy
        measured = (
            f"{accuracy.measure} on {accuracy.rows:,} rows of {accuracy.source}: float "
            f"{accuracy.float_percent:.2f}%, {self.optimization.method} {accuracy.optimized_percent:.2f}%"
        )
        if self.answers_hold:
            drop, gate = accuracy.drop_points, accuracy.max_drop_points
            return f"gate holds: accuracy drop {drop:.2f} points <= {gate:g} ({measured})"
        return (
            f"refused: the accuracy drop is {accuracy.drop_points:.2f} points ({measured}), over "
            f"--max-accuracy-drop {accuracy.max_drop_points:g}; nothing was pushed"
        )

    def _tolerance_reason(self, figures: ToleranceFigures) -> str:
        errors = f"max abs error {figures.max_abs_error:.6g}, max rel error {figures.max_rel_error:.6g}"
        source = self.optimization.accuracy.source
        if self.answers_hold:
            return f"gate holds: all {figures.rows:,} rows within {figures.tolerance.rule} ({errors}; {source})"
        return (
            f"refused: {figures.rows_outside:,} of {figures.rows:,} rows of {source} outside "
            f"{figures.tolerance.rule} ({figures.tolerance.flags}); {errors}; worst: {figures.worst}; "
            "nothing was pushed"
        )

    def to_dict(self) -> dict[str, Any]:
        import msgspec

        return {
            "source": self.source.key,
            "gate": "tolerance" if self.tolerance is not None else "accuracy",
            "holds": self.holds,
            "pushed": self.pushed.key if self.pushed else None,
            "registry": self.registry_uri,
            "reason": self.reason,
            "notes": self.notes,
            "tolerance": self.tolerance.to_dict() if self.tolerance is not None else None,
            "speed_gate": self.speed.to_dict(),
            "optimization": msgspec.to_builtins(self.optimization),
        }


# --------------------------------------------------------------------------------------- measuring


def machine() -> str:
    import onnxruntime as ort

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.machine()}, {cpus} CPUs, onnxruntime {ort.__version__}, 1 intra-op thread"


# ------------------------------------------------------------------------------------------- the run


def optimize(
    registry: ModelRegistry,
    target: str,
    *,
    method: Method = "dynamic-int8",
    calibration_file: Path | None = None,
    eval_file: Path | None = None,
    max_drop: Fraction = Fraction(1, 2),
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    version: str | None = None,
    speed_sec: float = 1.0,
    allow_slower: bool = False,
    max_speed_ratio: float = MAX_SPEED_RATIO,
) -> Outcome:
    """The whole command: fetch, build, measure, gate, push. Raises `ServingError`s for the user's mistakes.
    `max_speed_ratio`: the speed gate's limit (servestack/optimize/speed.py); the command always uses the
    default, and a test sets it where it must know the decision whatever the machine measures."""
    import onnxruntime as ort

    from servestack.inference.manifest import HOOKS_FILE, Optimization
    from servestack.inference.packaging import create_package
    from servestack.inference.service import ServedModel
    from servestack.inference.settings import ServingSettings

    if method not in METHODS:
        raise invalid(
            f"--method: {method!r} is not a method", field="--method", value=method, allowed=", ".join(METHODS)
        )
    name, _, ref = target.partition("@")
    source_version = registry.resolve(name, ref or None)
    new_version = _new_version(registry, name, version)
    settings = ServingSettings(providers="CPUExecutionProvider", intra_op_threads=1)
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="servestack-optimize-") as scratch:
        work = Path(scratch)
        source_dir = registry.fetch(name, source_version, work / "cache")
        float_model = ServedModel.load(source_dir, settings)
        source = float_model.manifest
        gate = gate_of(source)
        sample = sample_request(registry, name, source_version)

        def rows_from(path: Path | None, purpose: str) -> Rows:
            if path is not None:
                lines, labels, numbers = parse_rows_file(path)
                return decode_rows(float_model, path.name, lines, numbers, labels)
            if sample is None:
                raise invalid(
                    f"{source.key} has no {SAMPLE_FILE} to take {purpose} rows from",
                    field=f"--{purpose}",
                    allowed="a JSON Lines file of rows",
                )
            return decode_sample(float_model, sample)

        evaluation = rows_from(eval_file, "eval")
        notes.extend(_eval_notes(evaluation, gate, eval_file is None))
        calibration = rows_from(calibration_file, "calibration") if method == "static-int8" else None
        if calibration is not None and calibration_file is None:
            notes.append(
                f"calibrated on the {calibration.count} rows of {SAMPLE_FILE}; --calibration gives better ranges"
            )

        built_dir = work / "built"
        built_dir.mkdir()
        built = build_optimized(source_dir / source.file, method, built_dir, calibration)
        weights, operators = int8_weights(built)
        if method in LOSSY and weights == 0 and "QuantizeLinear" not in operators:
            notes.append(
                f"nothing was quantized: onnxruntime quantizes MatMul/Gemm/Conv-style weights and this graph has "
                f"{', '.join(operators)}; the new version differs by graph optimizations only"
            )
        elif method in LOSSY and weights == 0:
            notes.append(
                "no weight was quantized (onnxruntime quantizes MatMul/Gemm/Conv-style weights); activations pass "
                "through QuantizeLinear/DequantizeLinear, which rounds them to int8 ranges and may change answers"
            )

        package = work / "package"
        hooks = source_dir / HOOKS_FILE
        built_manifest = create_package(
            built,
            package,
            name=name,
            version=new_version,
            labels=source.labels,
            prediction_output=source.prediction_output,
            probability_output=source.probability_output,
            process_file=hooks if hooks.is_file() else None,
            # The hooks' files go along; the float model's external data does not (the new graph has its own).
            files={entry.name: source_dir / entry.name for entry in source.files if not entry.external_data},
        )
        _check_signature(method, built_manifest, source)
        optimized = ServedModel.load(package, settings)

        figures: ToleranceFigures | None = None
        if gate == "tolerance":
            accuracy, figures = measure_tolerance(float_model, optimized, evaluation, tolerance)
            answers_hold = figures.holds
        else:
            accuracy, drop = measure_accuracy(float_model, optimized, evaluation, max_drop)
            answers_hold = drop <= max_drop
        speed = measure_speed(float_model, optimized, evaluation, speed_sec)
        speed_gate = measure_speed_gate(
            float_model, optimized, evaluation, speed_sec, max_ratio=max_speed_ratio, allow_slower=allow_slower
        )
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
        pushed: Manifest | None = None
        if answers_hold and speed_gate.holds:
            _finish_package(package, source, built_manifest, optimization, sample)
            pushed = registry.push_package(package).manifest
        return Outcome(source, optimization, answers_hold, speed_gate, pushed, registry.uri, notes, figures)


def _new_version(registry: ModelRegistry, name: str, version: str | None) -> str:
    """`--version`, else the next integer; an existing version is refused before any work (versions are
    immutable: say so now, not after measuring)."""
    from servestack.inference.errors import RegistryError
    from servestack.inference.registry import check_version

    existing = registry.versions(name)
    new_version = version or str(max([int(v) for v in existing if v.isdigit()], default=0) + 1)
    check_version(new_version)
    if new_version in existing:
        raise RegistryError(
            f"{name}@{new_version} already exists",
            field="--version",
            value=new_version,
            allowed=f"a version not in {', '.join(existing)}",
        )
    return new_version


def _eval_notes(evaluation: Rows, gate: str, from_sample: bool) -> list[str]:
    notes = []
    if from_sample and gate == "accuracy":
        notes.append(
            f"no --eval: agreement on the {evaluation.count} rows of {SAMPLE_FILE}, where one disagreement "
            f"costs {100 / evaluation.count:.1f} points; pass --eval rows.jsonl for a real measure"
        )
    elif from_sample:
        notes.append(
            f"no --eval: the tolerance gate compares the {evaluation.count} rows of {SAMPLE_FILE}; pass --eval "
            "rows.jsonl to cover the range of your data"
        )
    if gate == "tolerance" and evaluation.labels is not None:
        notes.append(
            "labels are not used for a regressor: the tolerance gate compares the optimized model's values with "
            "the float model's"
        )
    return notes


def _check_signature(method: str, built: Manifest, source: Manifest) -> None:
    from servestack.inference.errors import RegistryError

    if (built.inputs, built.outputs) != (source.inputs, source.outputs):
        raise RegistryError(
            f"{method} changed the model's signature: {built.inputs}/{built.outputs} instead of "
            f"{source.inputs}/{source.outputs}",
            field="--method",
            value=method,
            allowed="a method that keeps inputs and outputs (try graph)",
        )


def _finish_package(
    package: Path, source: Manifest, built: Manifest, optimization: Optimization, sample: bytes | None
) -> None:
    """The new version's manifest is the source's (columns, labels, NaN policy and all) with this version's
    file, checksums and figures; its sample is the source's sample request and its own answer to it (what
    smoke tests compare), written by the same code as `models push`."""
    import msgspec

    from servestack.inference.packaging import write_manifest
    from servestack.inference.push_samples import write_samples

    manifest = msgspec.structs.replace(
        source,
        version=built.version,
        file=built.file,
        sha256=built.sha256,
        process_sha256=built.process_sha256,
        files=built.files,
        description=f"{source.description} ({optimization.method} of version {source.version})".strip(),
        optimization=optimization,
    )
    write_manifest(package, manifest)
    if sample is not None:
        write_samples(package, manifest, json.loads(sample))


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
    lines.append(outcome.speed.describe(o.method))
    lines.append(outcome.reason)
    if outcome.pushed is not None:
        lines.append(f"pushed {outcome.pushed.key} to {outcome.registry_uri} (sha256 {outcome.pushed.sha256})")
        lines.append(f"  serve it with: servestack models promote {outcome.pushed.name} {outcome.pushed.version}")
    elif not outcome.answers_hold and o.method in LOSSY:
        wider = "larger --max-abs-error / --max-rel-error" if outcome.tolerance else "larger --max-accuracy-drop"
        lines.append(
            f"  try: --method static-int8 with --calibration rows.jsonl, --method graph (lossless), or a {wider}"
        )
    elif not outcome.speed.holds:
        others = {
            "dynamic-int8": "--method static-int8 with --calibration rows.jsonl (QDQ int8 kernels, no ConvInteger), "
            "--method graph, ",
            "static-int8": "--method graph, ",
        }.get(o.method, "")
        lines.append(f"  try: {others}or --allow-slower to push it anyway")
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
        help=f"classifiers: points of accuracy the new version may lose (default {DEFAULT_MAX_DROP})",
    )
    parser.add_argument(
        "--max-abs-error",
        default=DEFAULT_MAX_ABS_ERROR,
        help=(
            "regressors: every value must be within max-abs-error + max-rel-error x |float model's value| "
            f"(default {DEFAULT_MAX_ABS_ERROR})"
        ),
    )
    parser.add_argument(
        "--max-rel-error",
        default=DEFAULT_MAX_REL_ERROR,
        help=f"regressors: see --max-abs-error (default {DEFAULT_MAX_REL_ERROR}, i.e. 1%%)",
    )
    parser.add_argument("--version", default=None, help="the new version label (default: the next integer)")
    parser.add_argument(
        "--allow-slower",
        action="store_true",
        help=(
            "push the new version even when it is slower than the source: by default it must take at most "
            f"{MAX_SPEED_RATIO:.2f}x the source's time per call (median of interleaved pairs on 32 eval rows, "
            "one thread); the measured ratio is printed either way"
        ),
    )
    parser.add_argument(
        "--speed-sec",
        type=float,
        default=1.0,
        help="seconds of timing per model and batch size, and for the speed gate's pairs (default 1.0)",
    )
    parser.add_argument("--report", type=Path, default=None, help="also write the outcome as JSON here")


def run(args: argparse.Namespace, registry: Callable[[], ModelRegistry]) -> int:
    """0: pushed; 1: the gate refused (nothing pushed). Bad input raises a ServingError, which the CLI prints
    in one line (exit 2). `registry` opens the one the flags name."""
    from servestack.failures import CommandError

    try:
        import onnx  # noqa: F401 - onnxruntime.quantization needs it; say so before doing any work
    except ImportError:
        raise CommandError("needs the onnx package: pip install 'servestack[cli]'") from None
    from servestack.progress import Progress

    with Progress().step(f"models optimize {args.target}", f"{args.method}: quantize, then accuracy and speed"):
        outcome = optimize(
            registry(),
            args.target,
            method=args.method,
            calibration_file=args.calibration,
            eval_file=args.eval,
            max_drop=parse_max_drop(args.max_accuracy_drop),
            tolerance=Tolerance.parse(args.max_abs_error, args.max_rel_error),
            version=args.version,
            speed_sec=args.speed_sec,
            allow_slower=args.allow_slower,
        )
    print(render(outcome))
    if args.report is not None:
        args.report.write_text(json.dumps(outcome.to_dict(), indent=2) + "\n")
    return 0 if outcome.holds else 1


__all__ = ["METHODS", "Outcome", "Tolerance", "arguments", "optimize", "parse_max_drop", "run"]
