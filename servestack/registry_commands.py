"""`servestack models push|list|promote|rollback|optimize`: the model registry from the command line.

The registry is `--registry URI`, else `$SERVESTACK_REGISTRY_URI`, else the one the running `local up` seeded
(its emulator's `s3://servestack-registry/models/`, from the state file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module to build its parser: keep onnxruntime out of `--help`
    from models.registry import ModelRegistry


def registry_from(uri: str | None, state_path: Path | None) -> ModelRegistry:
    from servestack.local import state
    from servestack.registry import open_registry

    chosen = uri or os.environ.get("SERVESTACK_REGISTRY_URI")
    if chosen:
        return open_registry(chosen)
    try:
        about = state.read(state_path)
    except FileNotFoundError:
        raise SystemExit(
            "registry: none given; pass --registry s3://bucket/prefix/ (or a directory), set "
            "SERVESTACK_REGISTRY_URI, or start `servestack local up` (its emulator holds one)"
        ) from None
    if "registry" not in about:
        raise SystemExit(f"registry: the running local up ({state_path or state.default_path()}) records none")
    from servestack.local.emulator import clients

    return open_registry(about["registry"], client=clients(about["endpoint_url"])["s3"])


def run(args: argparse.Namespace) -> int:
    from models.errors import ServingError
    from models.registry import archive_key

    if args.models_command == "optimize":
        from servestack import optimize

        return optimize.run(args, lambda: registry_from(args.registry, args.state))
    try:
        registry = registry_from(args.registry, args.state)
        if args.models_command == "push":
            labels = [label.strip() for label in args.labels.split(",")] if args.labels else None
            pushed = registry.push(
                args.model, name=args.name, version=args.version, labels=labels, process_file=args.process
            )
            verb = "pushed" if pushed.created else "already present (same bytes)"
            print(f"{pushed.manifest.key} {verb} to {registry.uri} (sha256 {pushed.manifest.sha256})")
            target = archive_key(pushed.manifest.name, pushed.manifest.version)
            print(f"  multi-model endpoints: TargetModel={target}")
            if args.promote:
                change = registry.promote(pushed.manifest.name, pushed.manifest.version)
                print(f"{change.name}: {change.alias} {change.previous} -> {change.current}")
        elif args.models_command == "list":
            names = [args.name] if args.name else registry.names()
            listing = {name: (registry.versions(name), registry.aliases(name)) for name in names}
            if args.json:
                shown = {
                    name: {"versions": versions, "aliases": aliases} for name, (versions, aliases) in listing.items()
                }
                print(json.dumps(shown, indent=2))
            else:
                for name, (versions, aliases) in listing.items():
                    pointers = ", ".join(f"{alias} -> {version}" for alias, version in aliases.items())
                    print(f"{name:<24} versions {', '.join(versions) or '-'}  {pointers}")
        elif args.models_command == "promote":
            change = registry.promote(args.name, args.version, args.alias)
            print(f"{change.name}: {change.alias} {change.previous} -> {change.current}")
        else:
            change = registry.rollback(args.name, args.alias)
            print(f"{change.name}: {change.alias} {change.previous} -> {change.current} (rolled back)")
    except ServingError as error:
        print(f"servestack models {args.models_command}: {error.message}", file=sys.stderr)
        if error.allowed:
            print(f"  allowed: {error.allowed}", file=sys.stderr)
        return 2
    return 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = commands.add_parser("models", help="the model registry: push, list, promote, rollback, optimize")
    sub = models.add_subparsers(dest="models_command", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--registry", default=None, help="s3://bucket/prefix/ or a directory (default: see docs)")
        parser.add_argument("--state", type=Path, default=None, help="state file of local up (to find its registry)")

    push = sub.add_parser("push", help="push any ONNX file as a new immutable version")
    push.add_argument("model", type=Path, help="the .onnx file")
    push.add_argument("--name", required=True, help="model name (a-z, 0-9, '-')")
    push.add_argument("--version", default=None, help="version label (default: the next integer)")
    push.add_argument("--labels", default=None, help="class labels, comma separated, indexed by class id")
    push.add_argument("--process", type=Path, default=None, help="a process.py with preprocess/postprocess hooks")
    push.add_argument("--promote", action="store_true", help="point the `live` alias at it")
    common(push)
    listing = sub.add_parser("list", help="models, versions and aliases")
    listing.add_argument("name", nargs="?", default=None)
    listing.add_argument("--json", action="store_true")
    common(listing)
    promote = sub.add_parser("promote", help="point an alias (default `live`) at a version")
    promote.add_argument("name")
    promote.add_argument("version")
    promote.add_argument("--alias", default="live")
    common(promote)
    rollback = sub.add_parser("rollback", help="point an alias back at the version it named before")
    rollback.add_argument("name")
    rollback.add_argument("--alias", default="live")
    common(rollback)
    from servestack.optimize import add_parser as add_optimize_parser

    add_optimize_parser(sub, common)
