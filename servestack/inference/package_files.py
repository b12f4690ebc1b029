"""A model package's own files beside its graph: the files given with `--file` (a vocabulary, labels, a
configuration), copied in and listed with their checksums and sizes; the hooks' declared requirements; and push
errors that name the user's files rather than the scratch package's (servestack/inference/packaging.py builds
the package around them)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from servestack.inference.errors import InvalidInput, ServingError
from servestack.inference.manifest import HOOKS_FILE, MANIFEST_FILE, PATH_PATTERN, SAMPLE_FILES, sha256_of

_PACKAGE_PATH = re.compile(PATH_PATTERN)
# The names of a package's own files, which a listed file cannot take (the model is always `model.onnx` here).
RESERVED_NAMES = (MANIFEST_FILE, HOOKS_FILE, "model.onnx", *SAMPLE_FILES)
# Never taken from a folder given with --file: version control, editors' and Python's caches.
_SKIPPED_NAMES = ("__pycache__",)
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


def checked_requirements(requirements: Sequence[str]) -> list[str]:
    """The package's declared requirements, each a PEP 508 requirement (`Pillow`, `tokenizers>=0.20`), in
    their normal form; an InvalidInput naming the one that is not."""
    if not requirements:
        return []
    from packaging.requirements import InvalidRequirement, Requirement

    found: list[str] = []
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as error:
            raise InvalidInput(
                f"--requirement {text!r} is not a requirement ({error})",
                field="requirements",
                allowed="a PEP 508 requirement: a distribution name, optionally with a version, e.g. Pillow>=10",
            ) from None
        if requirement.url:
            raise InvalidInput(
                f"--requirement {text!r} names a URL", field="requirements", allowed="a name from the package index"
            )
        found.append(str(requirement))
    return sorted(set(found))


def gather_files(paths: Sequence[Path], flag: str = "--file") -> dict[str, Path]:
    """The package paths of files given with `--file`: a file goes at the package's root under its own name; a
    folder goes as a folder of that name, with every file below it at the same relative path (names starting
    with '.' and Python's caches left out). Errors name the path as given."""
    gathered: dict[str, Path] = {}

    def add(name: str, source: Path, given: Path) -> None:
        if not _PACKAGE_PATH.fullmatch(name) or name in RESERVED_NAMES:
            raise InvalidInput(
                f"{flag} {given}: {name!r} cannot be a file of a model package",
                field=flag,
                value=str(source),
                allowed="names of letters, digits, '.', '_', '-' (not starting with '.'), at most 8 folders deep, "
                f"none of {MANIFEST_FILE}, {HOOKS_FILE}, model.onnx, {', '.join(SAMPLE_FILES)}",
            )
        if name in gathered and gathered[name].resolve() != source.resolve():
            raise InvalidInput(
                f"{flag} {given}: {name!r} is also {gathered[name]}; a package holds one file of each name",
                field=flag,
                value=name,
            )
        gathered[name] = source

    for given in paths:
        if given.is_file():
            add(given.resolve().name, given, given)
        elif given.is_dir():
            found = list(_folder_files(given))
            if not found:
                raise InvalidInput(f"{flag} {given}: the folder holds no files", field=flag, value=str(given))
            for relative, source in found:
                add(f"{given.resolve().name}/{relative}", source, given)
        else:
            raise InvalidInput(f"{flag} {given}: no such file or folder", field=flag, value=str(given))
    return gathered


def _folder_files(folder: Path) -> Iterator[tuple[str, Path]]:
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIPPED_NAMES)
        for name in sorted(filenames):
            if not name.startswith(".") and not name.endswith(_SKIPPED_SUFFIXES):
                yield (here / name).relative_to(folder).as_posix(), here / name


def copy_files(
    destination: Path, files: dict[str, Path], external_data: Mapping[str, Path], sources: dict[str, Path]
) -> list[dict[str, Any]]:
    """Copy `files` into the package (external data is there already) and list both, sorted by name, with the
    checksum and size of the copies: what every load verifies."""
    for name, source in files.items():
        if name in external_data:
            if source.resolve() == external_data[name].resolve():
                continue  # named with --file as well: one file, listed once, as external data
            raise InvalidInput(
                f"--file {source}: {name!r} is the name of the model's external data ({external_data[name]})",
                field="--file",
                value=name,
            )
        if name in RESERVED_NAMES:
            raise InvalidInput(f"--file {source}: {name!r} is the name of another file of the package", field="--file")
        copied = destination / name
        copied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copied)
        sources[name] = source
    names = sorted({*files, *external_data})
    return [
        {
            "name": name,
            "sha256": sha256_of(destination / name),
            "size": (destination / name).stat().st_size,
            "external_data": name in external_data,
        }
        for name in names
    ]


def named_for_user(error: ServingError, destination: Path, sources: Mapping[str, Path]) -> ServingError:
    """`error` with the scratch package's paths replaced by the files the user gave (their copies' origins), and
    any other path inside it by `<package>/...`: a push error names the user's own files."""
    replacements = [(str(destination / name), str(source)) for name, source in sources.items()]
    replacements.sort(key=lambda pair: -len(pair[0]))
    replacements += [(str(destination), "<package>")]
    if destination.resolve() != destination:
        replacements += [(str(destination.resolve()), "<package>")]

    def fixed(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        for scratch, user in replacements:
            text = text.replace(scratch, user)
        return text

    message = fixed(error.message)
    if message == error.message and fixed(error.value) == error.value:
        return error
    if "<package>" in message:
        message += " (<package> is the package being built: a file the hooks read goes in it with --file)"
    renamed = type(error)(message, field=error.field, value=fixed(error.value), allowed=fixed(error.allowed))
    renamed.__cause__ = error.__cause__
    return renamed
