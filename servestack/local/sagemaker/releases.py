"""Local releases that last: the version `servestack local deploy` leaves live, kept across restarts of local up.

A successful `local deploy NAME --version V` records `V` in `.servestack/releases.json` (the project's state
folder, kept by `local down`). The next `local up` starts that deployment's variant (or inference component) on
`V`, fetched from the emulator's registry, instead of serving.yaml's pinned version, and says so:
`digits-api: serving version 2 (from local deploy at <time>; serving.yaml pins 1)`. Pinning `V` or any other
version in serving.yaml (or `local up --fresh`, which starts from serving.yaml alone) ends the override:
serving.yaml wins once it pins something other than what it pinned when the release was made.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RELEASES_FILE = "releases.json"


def path_of(work: Path) -> Path:
    """`work` is the project's `.servestack` folder."""
    return work / RELEASES_FILE


def key_of(deployment: str, component: str | None) -> str:
    return f"{deployment}/{component}" if component else deployment


def read(work: Path) -> dict[str, dict[str, Any]]:
    try:
        loaded = json.loads(path_of(work).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def record(work: Path, deployment: str, component: str | None, model: str, version: str, previous: str) -> None:
    """What a successful rehearsal left live, for the next start. `pinned` is the version serving.yaml pinned when
    the first of a run of releases started (`previous` then): a later start applies the release only while
    serving.yaml still pins that version."""
    releases = read(work)
    key = key_of(deployment, component)
    earlier = releases.get(key)
    chained = earlier is not None and earlier.get("model") == model and earlier.get("version") == previous
    releases[key] = {
        "model": model,
        "version": version,
        "previous": previous,
        "pinned": earlier.get("pinned", previous) if chained and earlier is not None else previous,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    work.mkdir(parents=True, exist_ok=True)
    temporary = path_of(work).with_suffix(".tmp")
    temporary.write_text(json.dumps(releases, indent=2) + "\n")
    temporary.replace(path_of(work))


def forget(work: Path) -> None:
    path_of(work).unlink(missing_ok=True)


def pin_hint(deployment: str, model: str, version: str) -> str:
    """What the deploy output says about serving.yaml."""
    return (
        f"{deployment}: version {version} stays live when local up restarts (recorded in .servestack/{RELEASES_FILE}); "
        f"to make it the deployed one, pin it in serving.yaml: deployments.{deployment}.version: {version} "
        f"(and list {model} version {version} under models)"
    )


def apply(
    work: Path,
    deployment: str,
    variant: dict[str, Any],
    fetch: Callable[[str, str], Path],
    notices: list[str],
) -> dict[str, Any]:
    """The variant (a `local up` endpoint config entry) on the recorded release's version, when one is recorded
    for it and differs from the template's; `fetch(model, version)` gives the package's folder. A release
    that cannot be fetched any more is reported and the template's version served."""
    release = read(work).get(key_of(deployment, variant.get("component")))
    if release is None or release.get("model") != variant["model"] or release.get("version") == variant["version"]:
        return variant
    version = str(release["version"])
    pinned = variant["version"]
    if str(release.get("pinned", release.get("previous"))) != pinned:  # serving.yaml moved on since: it wins
        notices.append(
            f"{deployment}: serving version {pinned} as serving.yaml pins it now; the local deploy of version "
            f"{version} at {release.get('at')} was made over version {release.get('pinned')} and no longer applies"
        )
        return variant
    try:
        package = fetch(variant["model"], version)
    except Exception as error:  # the registry lost it (local up --fresh elsewhere): serve serving.yaml's
        notices.append(
            f"{deployment}: serving version {pinned} as serving.yaml pins it; the version {version} of "
            f"local deploy at {release.get('at')} is not in the registry any more ({error})"
        )
        return variant
    notices.append(
        f"{deployment}: serving version {version} (from local deploy at {release.get('at')}; "
        f"serving.yaml pins {pinned})"
    )
    return {**variant, "version": version, "package_dir": str(package)}


__all__ = ["RELEASES_FILE", "apply", "forget", "path_of", "pin_hint", "read", "record"]
