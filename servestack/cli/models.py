"""`servestack models push|list|promote|rollback`: model packages and the registry from the command line.

`push` turns any ONNX file into a package in the project (`models/artifacts/<name>/<version>/`, where
serving.yaml, `local up` and `make synth` look for it) and pushes it to the registry when there is one. The
registry is `--registry URI`, else `$SERVESTACK_REGISTRY_URI`, else the one the running `local up` seeded (its
emulator's `s3://servestack-registry/models/`, found through the project's state file). `list`, `promote` and
`rollback` need a registry.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servestack.failures import CommandError, ExitCode, NotRunning

if TYPE_CHECKING:  # the CLI imports this module to build its parser: keep onnxruntime out of `--help`
    from servestack.inference.packaging import BuiltPackage
    from servestack.inference.registry import AliasChange, ModelRegistry

REGISTRY_HELP = (
    "s3://bucket/prefix/ or a directory (default: $SERVESTACK_REGISTRY_URI, else the registry of the "
    "running `servestack local up`)"
)


# ------------------------------------------------------------------------------------------ arguments


def _registry_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry", default=None, help=REGISTRY_HELP)
    parser.add_argument(
        "--state", type=Path, default=None, help="state file of local up, to find its registry (default: the project's)"
    )


def push_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="the .onnx file (skl2onnx's ZipMap output is turned into a tensor)")
    parser.add_argument("--name", required=True, help="model name (a-z, 0-9, '-')")
    parser.add_argument("--version", default=None, help="version label (default: the next integer)")
    parser.add_argument(
        "--labels",
        default=None,
        help="class labels, comma separated, in class id order (default: the graph's class labels, if any)",
    )
    parser.add_argument("--process", type=Path, default=None, help="a process.py with preprocess/postprocess hooks")
    parser.add_argument(
        "--image",
        nargs="?",
        const="",
        default=None,
        metavar="KEY=VALUE,...",
        help='serve the model\'s one image input from pictures (JPEG, PNG, WebP bodies; JSON {"instances": '
        '[{"b64": ...}]}; multipart forms), with no hook: decoded to RGB, the shorter side resized to resize=N '
        "(optional), the centre cropped to crop=N or HxW (default: the input's size), scaled to [0, 1], normalized "
        "by mean=R:G:B and std=R:G:B (default 0 and 1), in layout=NCHW or NHWC (default: read from the input's "
        "shape). E.g. --image resize=256,crop=224,mean=0.485:0.456:0.406,std=0.229:0.224:0.225. Adds Pillow to "
        "the package's requirements; a --process preprocess hook, if given, reads the pictures instead",
    )
    parser.add_argument(
        "--outputs",
        default=None,
        metavar="ROLE[=OUTPUT]",
        help="what a classifier's output holds: logits (answered as their softmax `probabilities`, their argmax "
        "`predictions` and its `labels`) or probabilities (answered with their argmax as `predictions`); OUTPUT "
        "defaults to the only output (default: an output named `logits` is logits, one named `probabilities` "
        "probabilities)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        metavar="K",
        help="JSON answers add each row's K most probable classes (class, label, probability), best first",
    )
    parser.add_argument(
        "--requirement",
        action="append",
        default=[],
        metavar="REQUIREMENT",
        help="a package process.py imports beyond servestack's runtime (e.g. Pillow>=10), repeatable: every "
        "deployment serving the model installs it in its bundle and image, locked when it is synthesized",
    )
    parser.add_argument(
        "--file",
        dest="files",
        metavar="PATH",
        type=Path,
        action="append",
        default=None,
        help="a file the package carries (a vocabulary, labels, a configuration), at the package's root under its "
        "name; or a folder (a tokenizer's), carried as a folder of that name with every file below it. Repeat it "
        "for more. Each is checksummed in the manifest and verified at every load; a hook reads them beside "
        "itself, Path(__file__).parent. The ONNX external data the model references (model.onnx.data) is found "
        "beside the .onnx file and needs no flag",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        metavar="TOKENIZER_JSON",
        help="a Hugging Face tokenizer.json the package carries: requests may then send texts (a text/plain body, "
        '{"instances": ["text", ...]}), tokenized into input_ids, attention_mask and token_type_ids by name, '
        "truncated to the model's maximum length and padded with the tokenizer's pad id; every deployment "
        "installs `tokenizers` for it",
    )
    parser.add_argument(
        "--sample",
        type=Path,
        default=None,
        help="example rows, stored as sample-request.json: a .csv with a header row, .parquet, .jsonl of row "
        "objects, or .json (a request body or a list of rows); its column names name the columns of a single "
        "[N, k] input (default: a request built from the model's signature)",
    )
    parser.add_argument(
        "--columns",
        default=None,
        help="names of a single [N, k] input's k columns, comma separated, in order (inputs of shape [N, 1] are "
        "columns already, named after themselves)",
    )
    parser.add_argument(
        "--allow-nan",
        nargs="?",
        const="",
        default=None,
        metavar="COLUMNS",
        help="the model handles missing values (e.g. HistGradientBoosting): NaN or null is accepted in every "
        "float column, or only in the comma-separated COLUMNS",
    )
    parser.add_argument(
        "--pad",
        action="append",
        default=[],
        metavar="INPUT=VALUE",
        help="pad ragged rows of a sequence input ([N, L]) with VALUE, to the batch's longest row (repeatable)",
    )
    parser.add_argument(
        "--max-length",
        action="append",
        default=[],
        metavar="INPUT=N",
        help="refuse rows of a sequence input longer than N values, with a 400 naming the row (repeatable)",
    )
    parser.add_argument(
        "--id-range",
        action="append",
        default=[],
        metavar="INPUT=LOW:HIGH",
        help="refuse ids of an integer sequence input outside LOW..HIGH-1 (default: read from the graph where the "
        "input indexes a Gather on a constant, e.g. a word embedding)",
    )
    parser.add_argument(
        "--artifacts",
        type=Path,
        default=None,
        help="where packages go, as <name>/<version>/ (default: models/artifacts in the project)",
    )
    parser.add_argument("--promote", action="store_true", help="point the registry's `live` alias at it")
    _registry_arguments(parser)


def list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", default=None, help="one model (default: every model)")
    parser.add_argument("--json", action="store_true", help="print JSON: {name: {versions, aliases}}")
    _registry_arguments(parser)


def promote_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the model")
    parser.add_argument("version", help="the version the alias should point at")
    parser.add_argument("--alias", default="live", help="the alias to move")
    _registry_arguments(parser)


def rollback_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the model")
    parser.add_argument("--alias", default="live", help="the alias to move back")
    _registry_arguments(parser)


# ------------------------------------------------------------------------------------------ the registry


def registry_from(uri: str | None, state_path: Path | None) -> ModelRegistry:
    """The registry to use; `NotRunning` (exit 3) saying how to get one when there is none."""
    found = optional_registry(uri, state_path)
    if found is None:
        raise NotRunning(
            "no registry: pass --registry s3://bucket/prefix/ (or a directory), set SERVESTACK_REGISTRY_URI, "
            "or start `servestack local up` in this project (its emulator holds one)"
        )
    return found[0]


def optional_registry(uri: str | None, state_path: Path | None) -> tuple[ModelRegistry, str] | None:
    """The registry and where it came from, or None when none is given and no local up is running."""
    from servestack.local.emulator import state

    if uri or os.environ.get("SERVESTACK_REGISTRY_URI"):
        from servestack.registry import open_registry

        if uri:
            return open_registry(uri), "--registry"
        return open_registry(os.environ["SERVESTACK_REGISTRY_URI"]), "SERVESTACK_REGISTRY_URI"
    try:
        about = state.read(state_path)
    except NotRunning:
        if state_path is not None:
            raise
        return None
    if "registry" not in about:
        raise NotRunning(f"the running local up ({state_path or state.default_path()}) records no registry")
    from servestack.local.emulator.moto_server import clients
    from servestack.registry import open_registry

    registry = open_registry(about["registry"], client=clients(about["endpoint_url"])["s3"])
    return registry, "the running local up"


# ------------------------------------------------------------------------------------------ commands


def run_push(args: argparse.Namespace) -> int:
    from servestack import project
    from servestack.inference.errors import VersionConflict
    from servestack.inference.package_files import gather_files
    from servestack.inference.packaging import build_package
    from servestack.inference.push_images import image_options
    from servestack.inference.push_outputs import parse_role
    from servestack.inference.push_sequences import sequence_options
    from servestack.inference.registry import DirectoryStore, ModelRegistry, check_name, check_version

    check_name(args.name)
    if not args.model.is_file():
        raise CommandError(f"{args.model}: no such file; give the path of your .onnx model")
    for flag, path in (("--process", args.process), ("--sample", args.sample)):
        if path is not None and not path.is_file():
            raise CommandError(f"{flag} {path}: no such file")
    files = gather_files(getattr(args, "files", None) or [])
    root = project.find_project()
    artifacts_dir = args.artifacts or (project.artifacts_root(root) if root is not None else None)
    remote = optional_registry(args.registry, args.state)
    if artifacts_dir is None and remote is None:
        raise CommandError(
            f"{project.not_found_hint()} (push writes the package into the project's models/artifacts); "
            "or pass --artifacts DIR, or --registry URI"
        )
    local = ModelRegistry(DirectoryStore(artifacts_dir)) if artifacts_dir is not None else None
    targets = [r for r in (local, remote[0] if remote else None) if r is not None]
    version = check_version(args.version or _next_version(targets, args.name))
    labels = [label.strip() for label in args.labels.split(",")] if args.labels else None
    columns = [name.strip() for name in args.columns.split(",")] if args.columns else None
    allow_nan: bool | list[str] = False
    if args.allow_nan is not None:
        allow_nan = [name.strip() for name in args.allow_nan.split(",") if name.strip()] or True
    previous = _previous_labels(targets, args.name, version)
    with tempfile.TemporaryDirectory(prefix="servestack-push-") as scratch:
        built = build_package(
            args.model,
            Path(scratch) / "package",
            name=args.name,
            version=version,
            labels=labels,
            process_file=args.process,
            sample=args.sample,
            requirements=args.requirement,
            columns=columns,
            allow_nan=allow_nan,
            files=files,
            sequences=sequence_options(args.pad, args.max_length, args.id_range),
            tokenizer=args.tokenizer,
            image=image_options(args.image),
            outputs_role=parse_role(args.outputs),
            top_k=args.top_k,
        )
        outcomes: list[str] = []
        try:
            if local is not None:
                pushed = local.push_package(built.directory)
                where = _shown(artifacts_dir / args.name / version) if artifacts_dir else ""
                outcomes.append(f"wrote    {where}/" if pushed.created else f"present  {where}/ (same bytes)")
            if remote is not None:
                pushed = remote[0].push_package(built.directory)
                verb = "pushed  " if pushed.created else "present "
                outcomes.append(f"{verb} {remote[0].uri} ({remote[1]})")
        except VersionConflict as conflict:
            raise CommandError(
                f"{conflict.message}: pass another --version, or leave it out for the next integer",
                ExitCode.CONFLICT,
            ) from None
        _report(built, args.model, outcomes, previous)
    if remote is None:
        print(
            "  registry none given and no local up running: `servestack local up` seeds its registry from "
            "models/artifacts when it starts (--registry s3://... pushes to S3)"
            + ("; --promote needs a registry, nothing promoted" if args.promote else "")
        )
    elif args.promote:
        print(_alias_line(remote[0].promote(args.name, version)))
    _print_snippet(root, args.name, version)
    return 0


def _next_version(registries: list[ModelRegistry], name: str) -> str:
    return str(max(int(r.next_version(name)) for r in registries))


def _previous_labels(registries: list[ModelRegistry], name: str, version: str) -> tuple[str, str] | None:
    """The labels of the newest other version of `name`, to say when this push changes them."""
    from servestack.inference.service import version_order

    for registry in registries:
        versions = [v for v in registry.versions(name) if v != version]
        if versions:
            newest = max(versions, key=version_order)
            manifest = registry.manifest(name, newest)
            if manifest is not None and manifest.labels:
                return newest, ",".join(map(str, manifest.labels))
    return None


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _report(built: BuiltPackage, source: Path, outcomes: list[str], previous: tuple[str, str] | None) -> None:
    from servestack.inference.manifest import HOOKS_FILE, SAMPLE_REQUEST, SAMPLE_RESPONSE, sha256_of

    manifest = built.manifest

    def described(spec: Any) -> str:
        shape = ", ".join(
            "N" if i == 0 and s is None else ("any" if s is None else str(s)) for i, s in enumerate(spec.shape)
        )
        role = {
            manifest.prediction_output: " (prediction)",
            manifest.probability_output: " (probabilities)",
            manifest.logits_output: " (logits)",
        }
        return f"{spec.name} {spec.dtype} [{shape}]{role.get(spec.name, '')}"

    print(f"{manifest.key}: packaged from {source}")
    for change in built.changes:
        print(f"  converted {change}")
    print(f"  inputs   {'; '.join(described(spec) for spec in manifest.inputs)}")
    print(f"  outputs  {'; '.join(described(spec) for spec in manifest.outputs)}")
    if manifest.labels is not None:
        print(f"  labels   {', '.join(map(str, manifest.labels))} (from {built.labels_source})")
    else:
        print(f"  labels   none{f' ({built.labels_note})' if built.labels_note else ''}")
    if manifest.image is not None:
        image = manifest.image
        resize = f"shorter side to {image.resize}, " if image.resize is not None else ""
        print(
            f"  image    {image.input}: JPEG/PNG/WebP -> RGB, {resize}centre {image.crop[0]}x{image.crop[1]}, "
            f"[0, 1], mean {list(image.mean)}, std {list(image.std)}, {image.layout}"
        )
    if manifest.top_k is not None:
        print(f"  top k    {manifest.top_k} classes in JSON answers")
    if manifest.columns:
        print(f"  columns  {', '.join(f'{c.name} {c.dtype}' for c in manifest.columns)}")
        nan = [column.name for column in manifest.columns if column.allow_nan]
        if nan:
            print(f"  NaN      allowed in {', '.join(nan)}")
        elif built.routes_missing_values:
            print("  note     the graph's trees handle missing values; pass --allow-nan to accept NaN and null")
    shown_labels = ",".join(map(str, manifest.labels or ()))
    if previous is not None and built.labels_source != "--labels" and shown_labels != previous[1]:
        print(f"  note     version {previous[0]} has labels {previous[1]}; pass --labels {previous[1]} to keep them")
    for entry in manifest.files:
        role = "external data, found beside the model" if entry.external_data else "--file"
        role = "--tokenizer" if entry.name == manifest.tokenizer else role
        print(f"  file     {entry.name} ({_size(entry.size)}, {role})")
    listed = {entry.name: entry.sha256 for entry in manifest.files}
    files = [manifest.file, *([HOOKS_FILE] if manifest.process_sha256 else []), *listed]
    for name in [*files, SAMPLE_REQUEST, SAMPLE_RESPONSE]:
        print(f"  sha256   {name} {listed.get(name) or sha256_of(built.directory / name)}")
    for outcome in outcomes:
        print(f"  {outcome}")


def _size(count: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _print_snippet(root: Path | None, name: str, version: str) -> None:
    """The serving.yaml lines that serve the pushed version (or a note that serving.yaml already has them)."""
    from servestack import project
    from servestack.spec import SpecError, load_spec

    declared: list[str] = []
    users: list[str] = []
    if root is not None:
        try:
            spec = load_spec(root / project.SPEC_FILE, check_artifacts=False)
            declared = [m.version for m in spec.models if m.name == name]
            users = [d for d, x in spec.deployments.items() if x.model == name]
        except SpecError:
            pass
    if version in declared:
        print(f"\nserving.yaml already declares {name}@{version}: `servestack local up` and `make synth` serve it.")
        return
    print("\nAdd to serving.yaml (then `servestack local up`, or `make synth` / `cdk deploy`):")
    print("models:")
    print(f"  - name: {name}")
    print(f"    version: {version}")
    if users:
        print(f"# and pin it with `version: {version}` in the deployments of {name}: {', '.join(users)}")
        return
    print("deployments:")
    print(f"  {name}-api:")
    print("    mode: serverless   # or realtime, async, batch")
    print(f"    model: {name}")
    print(f"    version: {version}")


def _alias_line(change: AliasChange, rolled_back: bool = False) -> str:
    if change.previous is None:
        return f"{change.name}: {change.alias} -> {change.current} (was unset)"
    if change.previous == change.current:
        return f"{change.name}: {change.alias} -> {change.current} (unchanged)"
    suffix = " (rolled back)" if rolled_back else ""
    return f"{change.name}: {change.alias} {change.previous} -> {change.current}{suffix}"


def run_list(args: argparse.Namespace) -> int:
    from servestack.inference.errors import ModelNotFound

    registry = registry_from(args.registry, args.state)
    known = registry.names()
    if args.name and args.name not in known:
        raise ModelNotFound(
            f"model {args.name!r} is not in the registry {registry.uri}",
            field="name",
            value=args.name,
            allowed=", ".join(known) or "(empty: servestack models push MODEL.onnx --name NAME)",
        )
    names = [args.name] if args.name else known
    listing = {name: (registry.versions(name), registry.aliases(name)) for name in names}
    if args.json:
        shown = {name: {"versions": versions, "aliases": aliases} for name, (versions, aliases) in listing.items()}
        print(json.dumps(shown, indent=2))
        return 0
    if not listing:
        print(f"{registry.uri}: no models yet (servestack models push MODEL.onnx --name NAME)")
    for name, (versions, aliases) in listing.items():
        pointers = ", ".join(f"{alias} -> {version}" for alias, version in aliases.items())
        print(f"{name:<24} versions {', '.join(versions) or '-'}  {pointers}".rstrip())
    return 0


def run_promote(args: argparse.Namespace) -> int:
    registry = registry_from(args.registry, args.state)
    print(_alias_line(registry.promote(args.name, args.version, args.alias)))
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    registry = registry_from(args.registry, args.state)
    print(_alias_line(registry.rollback(args.name, args.alias), rolled_back=True))
    return 0


def optimize_arguments(parser: argparse.ArgumentParser) -> None:
    from servestack.optimize.optimizer import arguments

    arguments(parser)
    _registry_arguments(parser)


def run_optimize(args: argparse.Namespace) -> int:
    from servestack.optimize import optimizer as optimize

    return optimize.run(args, lambda: registry_from(args.registry, args.state))
