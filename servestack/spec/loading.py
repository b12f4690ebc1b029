"""The whole `serving.yaml` (`ServingSpec`: its models and its deployments, one of each mode's) and its loading:
`parse_spec` and `load_spec` turn every problem into one `<dotted path>: <value> is not <allowed>` line."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError

from servestack.spec.base import Name, SpecError, Strict
from servestack.spec.blocks import ModelSpec
from servestack.spec.modes import AsyncDeployment, BatchDeployment, ServerlessDeployment
from servestack.spec.realtime import RealtimeDeployment

MODES = ("realtime", "serverless", "async", "batch")


Deployment = Annotated[
    RealtimeDeployment | ServerlessDeployment | AsyncDeployment | BatchDeployment,
    Field(discriminator="mode"),
]


class ServingSpec(Strict):
    """The whole `serving.yaml`."""

    models: list[ModelSpec] = Field(min_length=1)
    deployments: dict[Name, Deployment] = Field(min_length=1)

    def model(self, name: str, version: str | None) -> ModelSpec:
        """The declared model `name` (@ `version`, or its only version)."""
        matches = [m for m in self.models if m.name == name and (version is None or m.version == version)]
        if len(matches) != 1:
            raise KeyError(f"{name}@{version or '?'}")
        return matches[0]

    def models_of(self, deployment: str) -> list[ModelSpec]:
        """Every model a deployment serves (its own, then variants', the shadow's, then components')."""
        d = self.deployments[deployment]
        refs: list[tuple[str, str | None]] = [(d.model, d.version)]
        if isinstance(d, RealtimeDeployment):
            refs += [(v.model, v.version) for v in d.variants]
            refs += [(d.shadow.model, d.shadow.version)] if d.shadow else []
            refs += [(c.model, c.version) for c in d.components]
        out: list[ModelSpec] = []
        for name, version in refs:
            m = self.model(name, version)
            if m not in out:
                out.append(m)
        return out


# --- loading ------------------------------------------------------------------------------------


def _references(spec: ServingSpec) -> Iterator[str]:
    """Cross-references pydantic cannot see: model names and versions used by deployments."""
    seen: set[str] = set()
    for i, m in enumerate(spec.models):
        if m.key in seen:
            yield f"models.{i}: {m.name}@{m.version} is not unique"
        seen.add(m.key)

    def check(path: str, name: str, version: str | None) -> Iterator[str]:
        versions = [m.version for m in spec.models if m.name == name]
        declared = ", ".join(sorted({m.name for m in spec.models}))
        if not versions:
            yield f"{path}.model: {name!r} is not a declared model ({declared})"
        elif version is None and len(versions) > 1:
            listed = ", ".join(versions)
            yield f"{path}.version: missing is not allowed when {name!r} has several versions ({listed})"
        elif version is not None and version not in versions:
            yield f"{path}.version: {version!r} is not a declared version of {name!r} ({', '.join(versions)})"

    for dname, d in spec.deployments.items():
        base = f"deployments.{dname}"
        yield from check(base, d.model, d.version)
        if isinstance(d, RealtimeDeployment):
            for i, v in enumerate(d.variants):
                yield from check(f"{base}.variants.{i}", v.model, v.version)
            if d.shadow:
                yield from check(f"{base}.shadow", d.shadow.model, d.shadow.version)
            for i, c in enumerate(d.components):
                yield from check(f"{base}.components.{i}", c.model, c.version)


def _format(err: Mapping[str, Any]) -> str:
    loc = [str(p) for p in err["loc"]]
    # Drop the discriminator tag pydantic inserts after `deployments.<name>`.
    if len(loc) >= 3 and loc[0] == "deployments" and loc[2] in MODES:
        del loc[2]
    if loc and loc[-1] == "[key]":
        loc.pop()
    kind = err["type"]
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    value = err.get("input")
    if kind == "unknown_key":
        keys: list[str] = ctx["keys"]
        return "\n".join(f"{_dotted([*loc, k])}: unknown key is not one of {ctx['allowed']}" for k in keys)
    if kind == "incoherent":
        loc.append(ctx["field"])
        return f"{_dotted(loc)}: {err['msg']}"
    if kind in {"union_tag_invalid", "union_tag_not_found"}:
        shown = repr(ctx.get("tag")) if kind == "union_tag_invalid" else "missing"
        return f"{_dotted([*loc, 'mode'])}: {shown} is not one of {', '.join(repr(m) for m in MODES)}"
    if kind == "missing":
        return f"{_dotted(loc)}: missing is not allowed (required)"
    if kind == "literal_error":
        return f"{_dotted(loc)}: {value!r} is not one of {ctx['expected']}"
    msg: str = err["msg"]
    if msg.startswith("Input should be "):
        return f"{_dotted(loc)}: {value!r} is not {msg.removeprefix('Input should be ')}"
    if msg.startswith("Value error, "):
        msg = msg.removeprefix("Value error, ")
    return f"{_dotted(loc)}: {msg}"


def _dotted(loc: list[str]) -> str:
    return ".".join(loc) or "<root>"


def parse_spec(data: object, source: str = "serving.yaml") -> ServingSpec:
    """Validate already-parsed YAML/JSON data; raise `SpecError` listing every problem."""
    try:
        spec = ServingSpec.model_validate(data)
    except ValidationError as exc:
        problems = [_format(e) for e in exc.errors(include_url=False)]
        raise SpecError(source, [line for p in problems for line in p.split("\n")]) from None
    problems = list(_references(spec))
    if problems:
        raise SpecError(source, problems)
    return spec


def load_spec(
    path: str | Path, *, artifacts_root: Path | None = None, bundled: bool = True, check_artifacts: bool = True
) -> ServingSpec:
    """Read and validate `serving.yaml`; raise `SpecError` naming each bad path, value and what is allowed.

    Then (`check_artifacts`) every declared model must have its package under `artifacts_root` (default: the
    folder holding the file), or be a bundled one (`bundled`); each missing one is a problem naming the
    folder and the command that creates it (servestack/artifacts.py)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(p), [f"<file>: {exc.strerror or exc} is not readable"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(str(p), [f"<yaml>: {exc} is not valid YAML"]) from None
    if not isinstance(data, dict):
        raise SpecError(str(p), [f"<root>: {type(data).__name__} is not a mapping with models and deployments"])
    spec = parse_spec(data, str(p))
    if check_artifacts:
        from servestack import artifacts

        root = artifacts_root or p.resolve().parent
        missing = list(artifacts.problems(spec, root, bundled=bundled))
        missing += list(_excluded_columns(spec, root, bundled=bundled))
        missing += list(_monitor_baselines(spec, root, bundled=bundled))
        if missing:
            raise SpecError(str(p), missing)
    return spec


def _excluded_columns(spec: ServingSpec, root: Path, *, bundled: bool) -> Iterator[str]:
    """`capture.exclude_columns` must name inputs or columns of the deployment's models (a misspelt name would
    leave personal data in the records): checked against each package's manifest."""
    from servestack import artifacts

    for name, d in spec.deployments.items():
        if d.capture is None or not d.capture.exclude_columns:
            continue
        known: set[str] = set()
        for model in spec.models_of(name):
            folder = artifacts.package_dir(model, root, bundled=bundled)
            if folder is None:
                continue
            manifest = json.loads((folder / artifacts.MANIFEST).read_text(encoding="utf-8"))
            for key in ("inputs", "columns"):
                known |= {str(entry.get("name")) for entry in manifest.get(key) or () if isinstance(entry, dict)}
        if not known:
            continue  # no manifest declares its inputs: nothing to check against
        for column in d.capture.exclude_columns:
            if column not in known:
                yield (
                    f"deployments.{name}.capture.exclude_columns: {column!r} is not one of the models' inputs or "
                    f"columns ({', '.join(sorted(known))})"
                )


def _monitor_baselines(spec: ServingSpec, root: Path, *, bundled: bool) -> Iterator[str]:
    """`monitor.baseline` must be a file of the project; without it the package must keep a baseline its function
    reads (`models push --sample` of a .csv or .jsonl file): its sample request alone holds 5 rows at most."""
    from servestack import artifacts
    from servestack.spec.blocks import MONITOR_BASELINE_SUFFIXES

    for name, d in spec.deployments.items():
        if d.monitor is None:
            continue
        where = f"deployments.{name}.monitor.baseline"
        if d.monitor.baseline is not None:
            if not (root / d.monitor.baseline).is_file():
                yield f"{where}: {d.monitor.baseline!r} is not a file of the project (a path relative to {root})"
            continue
        folder = artifacts.package_dir(spec.model(d.model, d.version), root, bundled=bundled)
        if folder is None:
            continue  # the missing package is its own problem
        manifest = json.loads((folder / artifacts.MANIFEST).read_text(encoding="utf-8"))
        names = [str(entry.get("name", "")) for entry in manifest.get("files") or () if isinstance(entry, dict)]
        kept = [file for file in names if file.startswith("baseline.")]
        if not kept:
            yield (
                f"{where}: missing is not allowed when the package {folder} keeps no baseline; push the model with "
                "--sample FILE (its training rows, .csv or .jsonl) or give baseline: FILE"
            )
        elif not kept[0].lower().endswith(MONITOR_BASELINE_SUFFIXES):
            yield (
                f"{where}: missing is not allowed when the package's baseline is {kept[0]} (the check's function "
                "has no pyarrow for Parquet); give baseline: FILE (.csv or .jsonl)"
            )
