"""The model package: `model.onnx` + `manifest.json` (+ optional `process.py` and listed files), and their checksums.

A package is the files its manifest names, each with its sha256: the model, the hooks (`process_sha256`) and
`files`, everything else the model and its hooks need (ONNX external data, a vocabulary, labels, a tokenizer's
configuration), at relative paths inside the package folder. `package_files` is that list, plus the manifest
and the sample request and response when present: what every copy of a package (the registry, its archive, a
Lambda bundle, an image context, SageMaker's model data) carries, and nothing else.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from servestack.inference.errors import ChecksumMismatch, ModelLoadError
from servestack.inference.image_spec import ImageSpec, check_image
from servestack.inference.paths import confined

MANIFEST_FILE = "manifest.json"
HOOKS_FILE = "process.py"
SAMPLE_REQUEST = "sample-request.json"  # a request the package answers (`models push` writes it)
SAMPLE_RESPONSE = "sample-response.json"  # ...and the answer it gave then
SAMPLE_FILES = (SAMPLE_REQUEST, SAMPLE_RESPONSE)
# Model names and versions: what a registry, a cache directory and a target-model header may hold. Neither can
# spell a path (`/`, `..`) and both are short, so they are safe as directory names wherever they are used.
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
# The model file a manifest names sits next to it: a plain file name, never a path.
FILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# A listed file of a package: a relative path of such names (at most 8 deep), never absolute, never `..`.
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
PATH_PATTERN = rf"^{_PART}(/{_PART}){{0,7}}$"

# The ONNX tensor element types the codecs can fill from JSON, CSV and .npy.
TensorDType = Literal["float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool", "string"]
Sha256 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]


@functools.cache
def numpy_dtype_of(name: str) -> np.dtype[Any]:
    """The numpy dtype for a manifest dtype name; cached, as the request path asks for it every time."""
    return np.dtype(object) if name == "string" else np.dtype(name)


class TensorSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One input or output: `shape` has None for free dimensions; the first is the batch dimension."""

    name: str
    dtype: TensorDType
    shape: tuple[int | None, ...]

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        return numpy_dtype_of(self.dtype)

    @property
    def row_shape(self) -> tuple[int | None, ...]:
        """The shape of one row: everything after the batch dimension."""
        return self.shape[1:]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


class ColumnSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One named column of a tabular model: the ONNX input it feeds and, for a `[N, k]` input, its position
    there (`index`; None when the input is `[N, 1]` and is this column). `allow_nan`: NaN (JSON `NaN` or
    `null`, an empty CSV cell) is a value the model handles, e.g. HistGradientBoosting's missing values."""

    name: str
    dtype: TensorDType
    input: str
    index: int | None = None
    allow_nan: bool = False


class SequenceInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """What a sequence input (a `[N, L]` input such as a BERT classifier's `input_ids`) takes beyond its dtype and
    shape. `pad`: rows of different lengths are padded with it, at their end, to the batch's longest row (or to
    L where the graph fixes it); `max_length`: the longest row taken (the graph's position table, say);
    `ids`: `[low, high)`, the values the graph can look up (a Gather on an embedding of `high` rows). A request
    past `max_length` or `ids` is refused with a 400 naming the input, the row and the bound, before
    onnxruntime sees it."""

    input: str
    pad: int | None = None
    max_length: Annotated[int, msgspec.Meta(ge=1)] | None = None
    ids: tuple[int, int] | None = None


class SpeedFigures(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Calls of one batch size through the float and the optimized model, measured in the same run."""

    batch_rows: int
    float_ms_per_call: float
    optimized_ms_per_call: float
    float_rows_per_sec: float
    optimized_rows_per_sec: float


class AccuracyFigures(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`accuracy`: both models against labels; `agreement`: the optimized model against the float one."""

    measure: Literal["accuracy", "agreement"]
    rows: int
    source: str
    float_percent: float
    optimized_percent: float
    drop_points: float
    max_drop_points: float


class Optimization(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """How a version was derived from another by `servestack models optimize`, and what was measured."""

    source_version: str
    source_sha256: Sha256
    method: Literal["graph", "dynamic-int8", "static-int8"]
    onnxruntime_version: str
    measured_on: str
    int8_weights: int
    float_bytes: int
    optimized_bytes: int
    calibration_rows: int | None = None
    calibration_source: str | None = None
    accuracy: AccuracyFigures
    speed: tuple[SpeedFigures, ...]


class PackageFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """A file the package carries besides the model and its hooks, verified at every load like the model.
    `external_data`: the model's graph reads tensors from it (ONNX external data), so it counts as the model's
    weights when a cache sizes a model."""

    name: Annotated[str, msgspec.Meta(pattern=PATH_PATTERN)]
    sha256: Sha256
    size: Annotated[int, msgspec.Meta(ge=0)]
    external_data: bool = False


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """What a model package declares about itself; `manifest.json` on disk. Parsed with msgspec, which
    validates as strictly as pydantic but keeps a Lambda cold start free of pydantic's import."""

    name: Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
    version: Annotated[str, msgspec.Meta(pattern=VERSION_PATTERN)]
    file: Annotated[str, msgspec.Meta(pattern=FILE_PATTERN)] = "model.onnx"
    sha256: Sha256
    process_sha256: Sha256 | None = None
    inputs: Annotated[tuple[TensorSpec, ...], msgspec.Meta(min_length=1)]
    outputs: Annotated[tuple[TensorSpec, ...], msgspec.Meta(min_length=1)]
    # Which output is "the" prediction, and which carries class probabilities, if any.
    prediction_output: str | None = None
    probability_output: str | None = None
    # An output of raw class scores (`models push --outputs logits`): answered as the softmax's probabilities, the
    # argmax's class and its label, and the `top_k` classes when set.
    logits_output: str | None = None
    top_k: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # Class labels, in the order of the probability columns. String labels also name integer class ids
    # (`--labels`); integer labels are the class values the model itself predicts.
    labels: tuple[str | int, ...] | None = None
    # The named columns of a tabular model (servestack/inference/columns.py); None: one column per `[N, 1]` input, if
    # any.
    columns: tuple[ColumnSpec, ...] | None = None
    allow_non_finite: bool = False
    # What the package's hooks import beyond servestack's runtime (PEP 508 requirements, `models push
    # --requirement`): each deployment serving the package installs them in its bundle and image, locked at synth.
    requirements: tuple[str, ...] = ()
    description: str = ""
    # Set on versions written by `servestack models optimize`: the source version, method and figures.
    optimization: Optimization | None = None
    # Every other file the package carries (external data, vocabularies...), each with its checksum and size.
    files: tuple[PackageFile, ...] = ()
    # Sequence inputs' padding value and bounds (`models push --pad/--max-length/--id-range`, or the graph).
    sequences: tuple[SequenceInput, ...] = ()
    # A Hugging Face `tokenizers` file among `files` (`models push --tokenizer`): texts are tokenized into the
    # inputs by name, `input_ids` and `attention_mask` / `token_type_ids` where the model has them
    # (servestack/inference/text_inputs.py).
    tokenizer: Annotated[str, msgspec.Meta(pattern=PATH_PATTERN)] | None = None
    # How a picture becomes a row of the image input (`models push --image`): decoded and preprocessed by
    # servestack when the package has no preprocess hook (servestack/inference/images.py).
    image: ImageSpec | None = None

    def __post_init__(self) -> None:
        if self.file in (MANIFEST_FILE, HOOKS_FILE):
            raise ValueError(f"file: {self.file!r} is the name of another file of the package")
        if self.files:
            _check_files(self.file, self.files)
        names = {output.name for output in self.outputs}
        for role in ("prediction_output", "probability_output", "logits_output"):
            chosen = getattr(self, role)
            if chosen is not None and chosen not in names:
                raise ValueError(f"{role}: {chosen!r} is not one of the outputs {sorted(names)}")
        if self.columns is not None:
            _check_columns(self.columns, self.inputs)
        if self.sequences:
            _check_sequences(self.sequences, self.inputs)
        if self.tokenizer is not None:
            _check_tokenizer(self.tokenizer, self.files, self.inputs)
        if self.image is not None:
            check_image(self.image, self.inputs)
        if self.logits_output is not None or self.top_k is not None:
            _check_class_roles(self)

    def sequence_of(self, input_name: str) -> SequenceInput | None:
        """The declared padding and bounds of an input, if any."""
        return next((entry for entry in self.sequences if entry.input == input_name), None)

    @property
    def primary_output(self) -> str:
        return self.prediction_output or self.outputs[0].name

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def to_json(self) -> bytes:
        return msgspec.json.format(msgspec.json.encode(self), indent=2) + b"\n"


def class_output(manifest: Manifest) -> str | None:
    """The output whose columns are the classes: the logits, else the probabilities."""
    return manifest.logits_output or manifest.probability_output


def _check_class_roles(manifest: Manifest) -> None:
    """Logits are a float `[N, K]` output other than the probabilities; top k needs class scores and at most K."""
    by_name = {spec.name: spec for spec in manifest.outputs}
    if manifest.logits_output is not None:
        spec = by_name[manifest.logits_output]
        if not spec.dtype.startswith("float") or len(spec.shape) != 2:
            raise ValueError(f"logits_output: {spec.name!r} is {spec.dtype} {list(spec.shape)}, not float [N, classes]")
        if manifest.logits_output in (manifest.probability_output, manifest.prediction_output):
            raise ValueError(f"logits_output: {spec.name!r} also has another role")
    scores = class_output(manifest)
    if manifest.top_k is not None:
        if scores is None:
            raise ValueError("top_k: needs an output of class scores (logits_output or probability_output)")
        classes = by_name[scores].shape[-1]
        if classes is not None and manifest.top_k > classes:
            raise ValueError(f"top_k: {manifest.top_k}, but {scores!r} has {classes} classes")


def _check_files(model_file: str, files: tuple[PackageFile, ...]) -> None:
    """Listed files are distinct, take no name of the package's own files, and none is a folder of another."""
    reserved = {MANIFEST_FILE, HOOKS_FILE, model_file, *SAMPLE_FILES}
    names = [entry.name for entry in files]
    for name in names:
        if name in reserved:
            raise ValueError(f"files: {name!r} is the name of another file of the package")
        if names.count(name) > 1:
            raise ValueError(f"files: {name!r} is listed twice")
        parents = {"/".join(name.split("/")[:depth]) for depth in range(1, name.count("/") + 1)}
        clash = parents & (set(names) | reserved)
        if clash:
            raise ValueError(f"files: {name!r} needs a folder {sorted(clash)[0]!r}, which is a file of the package")


def _check_sequences(sequences: tuple[SequenceInput, ...], inputs: tuple[TensorSpec, ...]) -> None:
    """Each entry names a `[N, L]` input once; padding and ids need a numeric input (ids an integer one), a
    maximum length at most a fixed L, and an id range at least one id wide."""
    by_name = {spec.name: spec for spec in inputs}
    seen: set[str] = set()
    for entry in sequences:
        spec = by_name.get(entry.input)
        if spec is None:
            raise ValueError(f"sequences: input {entry.input!r} is not one of {sorted(by_name)}")
        if entry.input in seen:
            raise ValueError(f"sequences: input {entry.input!r} is named twice")
        seen.add(entry.input)
        if len(spec.row_shape) != 1:
            raise ValueError(f"sequences.{entry.input}: a sequence input is [N, L], this one is {list(spec.shape)}")
        if spec.dtype in ("string", "bool") and (entry.pad is not None or entry.ids is not None):
            raise ValueError(f"sequences.{entry.input}: pad and ids need a numeric input, this one is {spec.dtype}")
        if entry.ids is not None:
            if not spec.dtype.startswith(("int", "uint")):
                raise ValueError(f"sequences.{entry.input}: ids need an integer input, this one is {spec.dtype}")
            if entry.ids[0] >= entry.ids[1]:
                raise ValueError(f"sequences.{entry.input}: ids [{entry.ids[0]}, {entry.ids[1]}) hold no id")
        fixed = spec.row_shape[0]
        if entry.max_length is not None and fixed is not None and entry.max_length > fixed:
            raise ValueError(f"sequences.{entry.input}: max_length {entry.max_length}, but the graph fixes {fixed}")


TOKENIZED_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _check_tokenizer(tokenizer: str, files: tuple[PackageFile, ...], inputs: tuple[TensorSpec, ...]) -> None:
    """The tokenizer is a listed file (so verified at every load), and the model's inputs are what it fills:
    `input_ids`, with `attention_mask` and `token_type_ids` where the model has them, each an integer `[N, L]`."""
    if tokenizer not in {entry.name for entry in files}:
        raise ValueError(f"tokenizer: {tokenizer!r} is not one of the package's files")
    names = [spec.name for spec in inputs]
    if "input_ids" not in names or not set(names) <= set(TOKENIZED_INPUTS):
        raise ValueError(f"tokenizer: the model's inputs {names} are not input_ids [, attention_mask, token_type_ids]")
    for spec in inputs:
        if len(spec.row_shape) != 1 or not spec.dtype.startswith(("int", "uint")):
            raise ValueError(f"tokenizer: input {spec.name!r} is {spec.dtype} {list(spec.shape)}, not integer [N, L]")


def _check_columns(columns: tuple[ColumnSpec, ...], inputs: tuple[TensorSpec, ...]) -> None:
    """Columns name inputs that exist, once each; a `[N, 1]` input is one column, a `[N, k]` input is exactly k
    columns at indexes 0..k-1; a column has its input's dtype; only float columns may allow NaN."""
    by_name = {spec.name: spec for spec in inputs}
    seen: set[str] = set()
    fed: dict[str, list[int | None]] = {}
    for column in columns:
        if column.name in seen:
            raise ValueError(f"columns: {column.name!r} is named twice")
        seen.add(column.name)
        spec = by_name.get(column.input)
        if spec is None:
            raise ValueError(f"columns.{column.name}: input {column.input!r} is not one of {sorted(by_name)}")
        if column.dtype != spec.dtype:
            raise ValueError(f"columns.{column.name}: dtype {column.dtype}, but input {spec.name!r} is {spec.dtype}")
        if column.allow_nan and not column.dtype.startswith("float"):
            raise ValueError(f"columns.{column.name}: allow_nan needs a float column, this one is {column.dtype}")
        fed.setdefault(column.input, []).append(column.index)
    for spec in inputs:
        indexes = fed.get(spec.name)
        if indexes is None:
            raise ValueError(f"columns: input {spec.name!r} has no column; name one for every input")
        width = spec.shape[1] if len(spec.shape) == 2 else None
        if len(spec.shape) != 2 or width is None:
            raise ValueError(f"columns: input {spec.name!r} of shape {list(spec.shape)} is not [N, 1] or [N, k]")
        if indexes == [None] and width == 1:
            continue
        if sorted(i if i is not None else -1 for i in indexes) != list(range(width)):
            raise ValueError(
                f"columns: input {spec.name!r} is [N, {width}]; its columns need the indexes 0..{width - 1} "
                f"once each, got {indexes}"
            )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(package_dir: Path) -> Manifest:
    """Parse `manifest.json`; a bad manifest is a load failure that says which field is wrong."""
    path = package_dir / MANIFEST_FILE
    try:
        return msgspec.json.decode(path.read_bytes(), type=Manifest)
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path}: no manifest; a model package needs {MANIFEST_FILE}") from exc
    except msgspec.DecodeError as exc:  # ValidationError too: its message names the path, e.g. `$.inputs`
        raise ModelLoadError(f"{path}: invalid manifest: {exc}") from exc


def listed_files(manifest: Manifest) -> list[str]:
    """The files the manifest names with a checksum: the model, the hooks when it has them, and `files`."""
    hooks = [HOOKS_FILE] if manifest.process_sha256 is not None else []
    return [manifest.file, *hooks, *(entry.name for entry in manifest.files)]


def package_files(package_dir: Path, manifest: Manifest) -> list[str]:
    """What a copy of the package carries: the manifest, every file it names, and the sample request and response
    when present. A named file that is missing refuses the package (`ModelLoadError` naming it): a copy without
    it would fail at its first load, far from here."""
    for name in listed_files(manifest):
        path = confined(package_dir, name, field="file")
        if not path.is_file():
            raise ModelLoadError(
                f"{path}: named by the manifest of {manifest.key} but missing from its package",
                field="file",
                value=name,
                allowed="a package with every file its manifest lists",
            )
    samples = [name for name in SAMPLE_FILES if (package_dir / name).is_file()]
    return [MANIFEST_FILE, *listed_files(manifest), *samples]


def model_bytes(package_dir: Path, manifest: Manifest) -> int:
    """The size of the model's weights on disk: the model file and its external data (what a cache counts)."""
    weights = [manifest.file, *(entry.name for entry in manifest.files if entry.external_data)]
    return sum(confined(package_dir, name, field="file").stat().st_size for name in weights)


def verify_checksums(package_dir: Path, manifest: Manifest) -> None:
    """Refuse a package whose model, hooks or listed files are not the bytes the manifest was written for (a
    listed file's size is compared first: a truncated copy costs no hashing)."""
    expected_files: list[tuple[str, str, int | None]] = [(manifest.file, manifest.sha256, None)]
    hooks = package_dir / HOOKS_FILE
    if hooks.exists() and manifest.process_sha256 is None:
        raise ChecksumMismatch(
            f"{hooks}: the package carries {HOOKS_FILE} but the manifest has no process_sha256; "
            f"rebuild the manifest so the hooks are covered by a checksum"
        )
    if manifest.process_sha256 is not None:  # a package that lost its hooks is refused, not served without them
        expected_files.append((HOOKS_FILE, manifest.process_sha256, None))
    expected_files += [(entry.name, entry.sha256, entry.size) for entry in manifest.files]
    for file_name, expected, size in expected_files:
        path = confined(package_dir, file_name, field="file")
        if not path.is_file():
            raise ModelLoadError(f"{path}: file named by the manifest does not exist")
        if size is not None and path.stat().st_size != size:
            raise ChecksumMismatch(
                f"{path}: size mismatch, manifest expects {size} bytes but the file has {path.stat().st_size}; "
                f"refusing to load an altered or corrupted package",
                field="size",
                value=path.stat().st_size,
                allowed=str(size),
            )
        actual = sha256_of(path)
        if actual != expected:
            raise ChecksumMismatch(
                f"{path}: sha256 mismatch, manifest expects {expected} but the file has {actual}; "
                f"refusing to load an altered or corrupted model",
                field="sha256",
                value=actual,
                allowed=expected,
            )
