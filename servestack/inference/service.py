"""Served models: load and verify packages, then turn request bodies into encoded responses.

This is the one inference pipeline every adapter calls: decode -> (preprocess) -> validate -> predict ->
(postprocess) -> encode. Adapters only parse their transport and map errors.
"""

from __future__ import annotations

import logging
import mmap
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servestack.inference import (
    answers,
    codecs,
    fast_paths,
    images,
    input_checks,
    media_types,
    request_forms,
    text_inputs,
)
from servestack.inference.columns import columns_of
from servestack.inference.errors import (
    InferenceError,
    InvalidInput,
    ModelLoadError,
    ModelNotFound,
    ModelNotReady,
    ServingError,
    short_repr,
    unconvertible,
)
from servestack.inference.hooks import Hooks, check_requirements, load_hooks
from servestack.inference.manifest import (
    HOOKS_FILE,
    MANIFEST_FILE,
    NAME_PATTERN,
    SAMPLE_REQUEST,
    VERSION_PATTERN,
    Manifest,
    read_manifest,
    verify_checksums,
)
from servestack.inference.output_roles import class_roles
from servestack.inference.paths import confined
from servestack.inference.runtime import Arrays, ModelRuntime
from servestack.inference.settings import ServingSettings
from servestack.inference.split_reader import SplitReader, split_reader

logger = logging.getLogger("servestack.models")
_UNKNOWN_CATEGORY = "Unknown Category"
# Looking for the value an encoder refused costs at most this many one-row runs per refused call...
_MAX_PROBES = 16
# ...and remembers at most this many values that passed, per model, each at most this long (a model whose string
# column is not one-hot encoded passes any text: what it remembers stays small).
_MAX_ACCEPTED_VALUES = 4096
_MAX_ACCEPTED_CHARS = 256


@dataclass
class ServedModel:
    """A verified, loaded and warmed model package."""

    manifest: Manifest
    runtime: ModelRuntime
    hooks: Hooks
    package_dir: Path
    max_batch_rows: int
    # The package's tokenizer (`models push --tokenizer`): texts become its inputs without a hook.
    text: text_inputs.TextInputs | None = None

    @classmethod
    def load(cls, package_dir: Path, settings: ServingSettings) -> ServedModel:
        """Verify every file of the package (the model, its hooks and its listed files), then load the model from
        its path in `package_dir`, so that onnxruntime reads the external data the graph names from that folder:
        the files just verified (`models push` lists every external data file of the graph, and the model's own
        checksum pins the graph)."""
        manifest = read_manifest(package_dir)
        verify_checksums(package_dir, manifest)
        runtime = ModelRuntime(
            manifest,
            confined(package_dir, manifest.file, field="file"),
            providers=settings.providers,
            intra_op_threads=settings.intra_op_threads,
            gpu_provider=settings.gpu_provider,
            gpu_fp16=settings.gpu_fp16,
            engine_cache=settings.cache_dir / "tensorrt-engines" / manifest.name / manifest.version,
        )
        hooks = load_hooks(package_dir / HOOKS_FILE, manifest.key, manifest.requirements)
        text = text_inputs.load_text_inputs(package_dir, manifest)
        if manifest.image is not None and hooks.preprocess is None:
            check_requirements(manifest.requirements, manifest.key)  # Pillow, which decodes its pictures
        model = cls(manifest, runtime, hooks, package_dir, settings.max_batch_rows, text)
        if settings.warmup:
            model.warm_up()
        return model

    def warm_up(self) -> None:
        """Run the package's sample request (through `preprocess`, whose form it is in) when it has one: a string
        column of a pipeline may refuse the empty strings of the runtime's zero batch (an encoder knows its
        categories). Else the runtime's zero batch."""
        sample = self.package_dir / SAMPLE_REQUEST
        if sample.is_file():
            try:
                arrays = self.decode(sample.read_bytes(), media_types.JSON)
            except ServingError:
                arrays = None  # an old sample this version no longer takes: the zero batch still warms it up
            if arrays is not None:
                self.predict(arrays)
                self.runtime.warmed_up = True
                return
        try:
            self.runtime.warm_up()
        except InferenceError as error:
            # A package without its sample (a registry holds model and manifest only) whose encoder refuses the
            # empty strings: the run got far enough to initialise the session; the model itself is fine.
            if not any(spec.dtype == "string" for spec in self.manifest.inputs):
                raise
            logger.info("%s: warm-up on empty strings stopped early (%s); serving", self.key, error.message[:200])
            self.runtime.warmed_up = True

    def __post_init__(self) -> None:
        self.max_values = fast_paths.max_values(self.manifest, self.max_batch_rows)
        self.rows_plan = (
            fast_paths.rows_plan(self.manifest, self.max_batch_rows) if self.hooks.preprocess is None else None
        )
        # Class scores that need their prediction derived (output_roles.py): answered as the derived outputs.
        self.roles = class_roles(self.manifest) if self.hooks.postprocess is None else None
        self.answer_manifest = self.roles.manifest if self.roles is not None else self.manifest
        plain = self.hooks.postprocess is None and (self.roles is None or self.roles.top_k is None)
        self.answer_plan = answers.answer_plan(self.answer_manifest) if plain else None
        self.image = self.manifest.image if self.hooks.preprocess is None else None
        self.key = self.manifest.key
        self.columns = columns_of(self.manifest)
        # A `dataframe_split` body of the common kind, read straight into the columns; only for a model whose JSON
        # by-name requests go to servestack/inference/request_forms.py (no hook, no tokenizer, no image input).
        plain = self.hooks.preprocess is None and self.text is None and self.image is None
        self.split_reader: SplitReader | None = split_reader(self.manifest, self.columns) if plain else None
        self._accepted_row_read = False
        self._accepted_row_arrays: Arrays | None = None
        self._accepted_values: set[tuple[str, str]] = set()

    def decode(self, body: bytes, content_type: str) -> Arrays:
        """Request body -> validated input arrays (through `preprocess` when the package has one).
        `content_type`: a media type, or `media_types.CSV_HEADER` for CSV whose first row names the columns."""
        header: bool | None = None
        if content_type == media_types.CSV_HEADER:
            content_type, header = media_types.CSV, True
        if content_type != media_types.NPY:
            if content_type != media_types.JSON and content_type != media_types.CSV:
                return self.decode_raw(body, content_type)  # past two string compares: the codecs' types never are
            fast_paths.check_value_count(
                body, self.max_values if self.hooks.preprocess is None else fast_paths.MAX_VALUES_FREE_SHAPE
            )
            if content_type == media_types.JSON and self.split_reader is not None:
                split = self.split_reader.arrays(body, self.max_batch_rows)
                if split is not None:
                    return split
        plan = self.rows_plan
        if plan is not None:  # the common request of a one-input float model, read straight from its bytes
            fast = (
                fast_paths.fast_json_body(body, plan) if content_type == media_types.JSON
                else fast_paths.fast_npy_body(body, plan) if content_type == media_types.NPY
                else None
            )  # fmt: skip
            if fast is not None:
                return fast
        payload = codecs.decode_body(body, content_type)
        # The scan for true/false serves the tensor paths; a by-name form never takes them, so it is not scanned
        # and says "may hold" (the conservative answer: any later tensor path then checks every element).
        booleans = content_type == media_types.JSON and (_by_name(payload) or fast_paths.may_hold_booleans(body))
        return self.decode_payload(payload, content_type, may_hold_booleans=booleans, header=header)

    def decode_raw(self, body: bytes, content_type: str) -> Arrays:
        """A body no codec reads (an image, audio, `application/octet-stream`, `text/plain`, a multipart form)
        -> validated input arrays: its bytes go to `preprocess` as they came, with the request's whole
        `content_type` (a multipart boundary, a charset). Without the hook, the 415 the codecs give, naming
        what they read. Its commas are not counted (`check_value_count`): they are bytes of an image, not values."""
        if self.image is not None:
            return self.image_arrays(images.pictures_of_body(body, content_type))
        if self.hooks.preprocess is None:
            if self.text is not None and media_types.media_type_of(content_type) == text_inputs.PLAIN_TEXT:
                return self.text.from_plain(body, content_type, max_rows=self.max_batch_rows)
            raise codecs.unsupported_media_type(content_type)
        return self.decode_payload(body, content_type)

    @property
    def reads_raw_bodies(self) -> bool:
        """Whether some body no codec reads is this model's to read (`reads_raw`): a hook, an image input, a
        tokenizer. A batch job of such a model reads every file under its prefix (tabular/files.py)."""
        return self.hooks.preprocess is not None or self.image is not None or self.text is not None

    def reads_raw(self, media_type: str) -> bool:
        """Whether a body of `media_type` that no codec reads is this model's to read (`decode_raw`): any, with a
        preprocess hook; pictures and forms, with a declared image input; plain text, with a tokenizer."""
        return (
            self.hooks.preprocess is not None
            or (
                self.image is not None
                and (media_type in media_types.IMAGE_TYPES or media_type == media_types.MULTIPART)
            )
            or (self.text is not None and media_type == text_inputs.PLAIN_TEXT)
        )

    def image_arrays(self, pictures: list[images.Picture]) -> Arrays:
        """The image input of a package that declares one (`models push --image`), from the request's pictures."""
        assert self.image is not None
        spec = next(spec for spec in self.manifest.inputs if spec.name == self.image.input)
        return {spec.name: images.image_rows(pictures, self.image, spec.numpy_dtype, self.max_batch_rows)}

    def decode_mapped(self, body: mmap.mmap) -> Arrays:
        """A large `.npy` body mapped from its file (servestack/adapters/body.py's `SpooledBody`) -> validated
        input arrays; with the model's dtype and row shape the input is a view of the mapping, no copy."""
        return self.decode_payload(codecs.parse_npy(body), media_types.NPY)

    def decode_payload(
        self, payload: Any, content_type: str, *, may_hold_booleans: bool = True, header: bool | None = None
    ) -> Arrays:
        """A decoded payload (what `codecs.decode_body` returns) -> validated input arrays. `header`: for CSV,
        whether the first row names the columns (None: it does when it equals the column names). A ValueError
        or OverflowError of a conversion that no check named first is the caller's `InvalidInput`."""
        try:  # no cost on the way through (Python 3.11's try is free until something raises)
            if self.hooks.preprocess is None:
                texts = text_inputs.texts_of(payload) if self.text is not None else None
                if texts is not None and self.text is not None and content_type == media_types.JSON:
                    return self.text.arrays(texts[1], field=texts[0], max_rows=self.max_batch_rows)
                if content_type == media_types.JSON and self.image is not None and images.is_b64_instances(payload):
                    return self.image_arrays(images.pictures_of_json(payload))
                if content_type == media_types.JSON:
                    fast = fast_paths.fast_instances(
                        payload, self.manifest, max_batch_rows=self.max_batch_rows, may_hold_booleans=may_hold_booleans
                    )
                    if fast is None:  # the by-name forms (inference/request_forms.py), after the tensor fast path
                        fast = request_forms.json_arrays(payload, self.manifest, max_rows=self.max_batch_rows)
                elif content_type == media_types.NPY:
                    fast = fast_paths.fast_npy(payload, self.manifest, max_batch_rows=self.max_batch_rows)
                elif content_type == media_types.CSV and (self.columns or header):
                    if header and not self.columns:  # a header on a model of unnamed columns says nothing: dropped
                        payload = payload[1:]
                        fast = None
                    else:
                        fast = request_forms.csv_arrays(
                            payload, self.manifest, header=header, max_rows=self.max_batch_rows
                        )
                else:
                    fast = None
                if fast is not None:
                    return fast
            if self.hooks.preprocess is not None:
                produced = self.hooks.run_preprocess(payload, content_type)
                if isinstance(produced, np.ndarray):
                    produced = {self.manifest.inputs[0].name: produced}
                if not isinstance(produced, Mapping):
                    raise InvalidInput(
                        f"model {self.manifest.key}: preprocess returned {type(produced).__name__}",
                        field="body",
                        allowed="an ndarray or a dict of input name to ndarray",
                    )
                raw = {name: (f"inputs.{name}", value) for name, value in produced.items()}
            else:
                raw = codecs.payload_to_arrays(payload, content_type, self.manifest)
            return input_checks.validate_inputs(
                raw, self.manifest, max_batch_rows=self.max_batch_rows, may_hold_booleans=may_hold_booleans
            )
        except (ValueError, OverflowError) as error:
            raise unconvertible("body", error) from None

    def predict(self, arrays: Mapping[str, np.ndarray]) -> Arrays:
        try:
            return self.runtime.predict(arrays)
        except InferenceError as error:
            if _UNKNOWN_CATEGORY not in error.message:
                raise
            # onnxruntime's OneHotEncoder (scikit-learn's, trained with handle_unknown="error") refusing a value
            # it never saw: the request's fault. onnxruntime does not say which column, so it is looked for.
            allowed = "the categories seen in training (or fit the encoder with handle_unknown='ignore')"
            found = self._unknown_category(arrays)
            if found is not None:
                column, value = found
                raise InvalidInput(
                    f"model {self.key}: column {column!r} holds {short_repr(value)}, a category the model was not "
                    "trained on",
                    field=column,
                    value=value,
                    allowed=allowed,
                ) from None
            strings = [column.name for column in self.columns if column.dtype == "string"]
            raise InvalidInput(
                f"model {self.key}: a string column holds a category the model was not trained on "
                f"(string columns: {strings})",
                field="body",
                value="unknown category",
                allowed=allowed,
            ) from None

    def _unknown_category(self, arrays: Mapping[str, np.ndarray]) -> tuple[str, str] | None:
        """The string column and value the model's encoder refused: each value of the request's string columns
        not known to pass (at most `_MAX_PROBES`) is tried alone, in a row the model accepts (the first of the
        package's sample request), and the values that pass are remembered, so the halves of a batch split for
        a bad request (servestack/inference/batching.py) do not try them again. Only on the failing path. None without a
        sample, past the probes, or when no value is refused alone."""
        base = self._accepted_row()
        if base is None:
            return None
        probes = 0
        for name, column in arrays.items():
            known = base.get(name)
            if known is None or known.size != 1 or column.dtype != object:
                continue
            for value in dict.fromkeys(text for text in column.reshape(-1).tolist() if isinstance(text, str)):
                if (name, value) in self._accepted_values:
                    continue
                if probes == _MAX_PROBES:
                    return None
                probes += 1
                try:
                    self.runtime.predict({**base, name: np.full_like(known, value)})
                except InferenceError as error:
                    if _UNKNOWN_CATEGORY in error.message:
                        return name, value
                    continue  # refused for another reason: neither the culprit nor known to pass
                if len(self._accepted_values) < _MAX_ACCEPTED_VALUES and len(value) <= _MAX_ACCEPTED_CHARS:
                    self._accepted_values.add((name, value))
        return None

    def _accepted_row(self) -> Arrays | None:
        """The first row of the package's sample request when the model accepts it (read once), else None."""
        if self._accepted_row_read:
            return self._accepted_row_arrays
        self._accepted_row_read = True
        sample = self.package_dir / SAMPLE_REQUEST
        try:
            arrays = self.decode(sample.read_bytes(), media_types.JSON) if sample.is_file() else None
            if arrays is not None:
                row = {name: value[:1] for name, value in arrays.items()}
                self.runtime.predict(row)
                self._accepted_row_arrays = row
        except (ServingError, OSError):
            pass  # no row to try values in: the error names the string columns only
        return self._accepted_row_arrays

    def respond(self, outputs: Arrays, media_type: str = media_types.JSON) -> dict[str, Any]:
        """Model outputs -> response fields, identical in every mode. `media_type`: the type they will be
        written in; only JSON writes class labels, so only JSON pays for naming them."""
        if self.roles is not None:
            outputs = self.roles.derive(outputs)
        return self._respond(outputs, media_type)

    def _respond(self, outputs: Arrays, media_type: str) -> dict[str, Any]:
        """`respond` of outputs whose class roles are derived already."""
        if self.hooks.postprocess is None:
            by_label = media_type == media_types.JSON_BY_LABEL
            with_labels = by_label or media_type == media_types.JSON
            response = answers.default_response(
                self.answer_manifest, outputs, with_labels=with_labels, by_label=by_label
            )
            if with_labels and self.roles is not None and self.roles.top_k is not None:
                response["top_k"] = self.roles.top(outputs[self.roles.scores])
            return response
        fields = self.hooks.run_postprocess(outputs)
        return {"model": self.manifest.name, "version": self.manifest.version, **fields}

    def answer(self, outputs: Arrays, media_type: str) -> media_types.Encoded:
        """Model outputs -> the response body in `media_type`: `respond` then `answers.encode_response`, written
        straight from the outputs when no postprocess hook shapes them (`answers.AnswerPlan`, `npy_answer`)."""
        if self.roles is not None:
            outputs = self.roles.derive(outputs)
        plan = self.answer_plan
        if plan is not None:
            if media_type == media_types.JSON:
                body = answers.json_answer(plan, outputs)
            elif media_type == media_types.NPY:
                body = answers.planned_npy_answer(plan, outputs)
            else:
                body = None
            if body is not None:
                return _new_encoded(media_types.Encoded, (body, media_type))  # the NamedTuple's own __new__ is Python
        if media_type == media_types.NPY and self.hooks.postprocess is None:
            return media_types.Encoded(answers.npy_answer(self.answer_manifest, outputs), media_types.NPY)
        return answers.encode_response(self._respond(outputs, media_type), media_type, self.manifest.labels)

    def infer(self, body: bytes, content_type: str | None, accept: str | None) -> media_types.Encoded:
        """The whole pipeline for one request. Raises only `ServingError`s."""
        media_type = media_types.answer_type_of(accept)  # refuse an impossible Accept before doing any work
        arrays = self.decode(body, media_types.request_type_of(content_type))
        return self.answer(self.predict(arrays), media_type)

    def describe(self) -> dict[str, Any]:
        manifest = self.manifest
        return {
            "name": manifest.name,
            "version": manifest.version,
            "ready": self.runtime.warmed_up,
            "providers": self.runtime.providers,
            "inputs": [spec.to_dict() for spec in manifest.inputs],
            "outputs": [spec.to_dict() for spec in manifest.outputs],
            "labels": list(manifest.labels) if manifest.labels else None,
            "columns": [{"name": c.name, "dtype": c.dtype, "allow_nan": c.allow_nan} for c in self.columns] or None,
            "has_hooks": self.hooks.preprocess is not None or self.hooks.postprocess is not None,
            "tokenizer": manifest.tokenizer,  # texts are taken as well as ids (servestack/inference/text_inputs.py)
        }


_new_encoded = tuple.__new__
_VERSION_PART = re.compile(r"(\d+)|(\D+)")
_NAME = re.compile(NAME_PATTERN)
_VERSION = re.compile(VERSION_PATTERN)
TARGET_FORMS = "name, name@version, name/version or name/version.tar.gz (name: a-z, 0-9, '-'; both <= 63 chars)"


def parse_target(target: str | None, default_model: str) -> tuple[str, str | None]:
    """A SageMaker target-model value or a REST name -> (name, version or None): `name`, `name@version`,
    `name/version`, `name/version.tar.gz`. Anything else (a path, `..`, `@` alone, a 5,000-character name) is
    `InvalidInput`: a target is checked here, before it names a directory, a registry key or a cache entry."""
    if target is None or not target.strip():
        return default_model, None
    cleaned = target.strip().removesuffix(".tar.gz").strip("/")
    name, _, version = cleaned.partition("@" if "@" in cleaned else "/")
    if not _NAME.fullmatch(name) or (version and not _VERSION.fullmatch(version)) or len(cleaned) > 127:
        shown = target if len(target) <= 80 else target[:77] + "..."
        raise InvalidInput(
            f"target model: {shown!r} does not name a model",
            field="target model",
            value=shown,
            allowed=TARGET_FORMS,
        )
    return name, version or None


def version_order(version: str) -> tuple[tuple[int, str], ...]:
    """'10' sorts after '9'; '1.10' after '1.9'."""
    return tuple((int(num), "") if num else (-1, text) for num, text in _VERSION_PART.findall(version))


@dataclass
class ModelRepository:
    """Every model package under `settings.model_dir`, loaded once per process.

    Layouts: `<dir>/manifest.json` (one model, as SageMaker mounts it) or `<dir>/<name>/<version>/`.
    """

    settings: ServingSettings
    _models: dict[str, dict[str, ServedModel]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _newest: dict[str, ServedModel] = field(default_factory=dict)
    state: str = "loading"
    error: str | None = None
    load_seconds: float | None = None

    def package_dirs(self) -> list[Path]:
        root = self.settings.model_dir
        if (root / MANIFEST_FILE).exists():
            return [root]
        return sorted(path.parent for path in root.glob(f"*/*/{MANIFEST_FILE}"))

    def load_all(self, only: str | None = None) -> None:
        """Load, verify and warm every package; readiness flips only when all of them are good. `only`: the
        packages of that model alone, where the folder holds several models (a batch job scores one; loading the
        others cost its start-up their verification and sessions). A name with no package loads them all, so that
        asking for it fails as it would have."""
        started = time.perf_counter()
        try:
            packages = self.package_dirs()
            chosen = [path for path in packages if path.parent.name == only] if only is not None else []
            packages = chosen or packages
            if not packages:
                raise ModelLoadError(
                    f"{self.settings.model_dir}: no model packages found "
                    f"(expected {MANIFEST_FILE} there or in <name>/<version>/ below it)"
                )
            for package_dir in packages:
                model = ServedModel.load(package_dir, self.settings)
                with self._lock:
                    versions = self._models.setdefault(model.manifest.name, {})
                    versions[model.manifest.version] = model
                    self._newest[model.manifest.name] = versions[max(versions, key=version_order)]
                logger.info("loaded %s from %s", model.manifest.key, package_dir)
            if not chosen and self.settings.default_model not in self._models:
                raise ModelLoadError(
                    f"default_model: {self.settings.default_model!r} is not among the loaded models "
                    f"{sorted(self._models)}"
                )
        except ServingError as exc:
            self.state, self.error = "failed", exc.message
            logger.error("model loading failed: %s", exc.message)
            raise
        self.load_seconds = time.perf_counter() - started
        self.state = "ready"

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def get(self, name: str | None = None, version: str | None = None) -> ServedModel:
        """A model by name (default model when None) and version (newest when None)."""
        if not self.ready:
            if self.state == "failed":
                raise ModelLoadError(f"models failed to load: {self.error}")
            raise ModelNotReady("models are still loading; retry shortly", field="model", allowed="retry later")
        wanted = name or self.settings.default_model
        versions = self._models.get(wanted)
        if versions is None:
            raise ModelNotFound(
                f"model {wanted!r} is not served here",
                field="model",
                value=wanted,
                allowed=", ".join(sorted(self._models)),
            )
        if version is None:
            return self._newest[wanted]
        if version not in versions:
            raise ModelNotFound(
                f"model {wanted!r} has no version {version!r}",
                field="version",
                value=version,
                allowed=", ".join(sorted(versions, key=version_order)),
            )
        return versions[version]

    def resolve(self, target: str | None) -> ServedModel:
        """A SageMaker target-model value or a REST name: `name`, `name@version`, `name/version`, `*.tar.gz`."""
        if target is None or not target.strip():
            return self.get()
        if target in self._newest and self.ready:  # the common case: a plain name
            return self._newest[target]
        name, version = parse_target(target, self.settings.default_model)
        return self.get(name, version)

    def lookup(self, target: str | None) -> ServedModel:
        """Every model here is resident: the same as `resolve` (the cache-backed repository may miss)."""
        return self.resolve(target)

    def models(self) -> list[ServedModel]:
        with self._lock:
            return [model for versions in self._models.values() for model in versions.values()]


def _by_name(payload: Any) -> bool:
    """A `dataframe_split` / `dataframe_records` request (servestack/inference/request_forms.py reads it by column
    name)."""
    return type(payload) is dict and ("dataframe_split" in payload or "dataframe_records" in payload)
