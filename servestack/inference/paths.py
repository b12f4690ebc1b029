"""Path confinement: the one check every file name or key from outside goes through before it touches disk.

Names come from manifests, registry keys and request headers; any of them may be absolute, hold `..`, or
point through a symbolic link to somewhere else. `confined(root, relative)` returns `root / relative` only
when the result stays inside `root` once resolved, and raises `UnsafePath` (400) otherwise, naming what was
refused and never the server's own directories.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from servestack.inference.errors import UnsafePath

MAX_RELATIVE_CHARS = 1024


def confined(root: Path, relative: str, *, field: str = "path") -> Path:
    """`root / relative`, refused unless it is a relative path that resolves inside `root`."""
    shown = relative if len(relative) <= 80 else relative[:77] + "..."
    allowed = "a relative path with no '..' that stays inside its directory"
    if not relative or len(relative) > MAX_RELATIVE_CHARS or "\x00" in relative or "\\" in relative:
        raise UnsafePath(f"{field}: {shown!r} is not a usable relative path", field=field, value=shown, allowed=allowed)
    parts = PurePosixPath(relative)
    if parts.is_absolute() or ".." in parts.parts:
        raise UnsafePath(f"{field}: {shown!r} reaches outside its directory", field=field, value=shown, allowed=allowed)
    base = root.resolve()
    candidate = (base / relative).resolve()
    if candidate != base and base not in candidate.parents:
        raise UnsafePath(f"{field}: {shown!r} leads outside its directory", field=field, value=shown, allowed=allowed)
    return root / relative
