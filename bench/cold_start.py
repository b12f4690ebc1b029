"""Lambda cold start from the real bundle: import + model load of `servestack.adapters.serverless`, .pyc present,
against a naive FastAPI + Mangum handler (bench/naive_lambda.py) placed in the same bundle.

    .venv/bin/python -m bench.cold_start [--runs 9]

Builds the Lambda asset exactly as `cdk synth` does (servestack/cdk/bundling.py: manylinux wheels for CPython 3.12),
then starts a clean `python3.12 -I -S` per run with only the bundle on sys.path, pinned to one core, the two
handlers alternating. Prints medians and the ratio; it never passes or fails on time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from servestack.cdk.bundling import LocalPythonBundler, find_python, tree_size_bytes
from servestack.local.hosting.processes import REPO_ROOT

TIMED_IMPORT = (
    "import sys, time; sys.path.insert(0, sys.argv[1]); t = time.perf_counter(); "
    "import {module}; print('INIT', time.perf_counter() - t)"
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)
    python = find_python("3.12")
    if python is None:
        sys.exit("needs a python3.12 interpreter (the Lambda runtime's version), e.g. pyenv install 3.12")
    with tempfile.TemporaryDirectory() as scratch:
        bundler = LocalPythonBundler(root=REPO_ROOT, artifacts=["models/artifacts/digits/1"], architecture="x86_64")
        bundle = bundler.bundle(Path(scratch) / "bundle")
        size = tree_size_bytes(bundle)
        (bundle / "bench").mkdir()
        for name in ("__init__.py", "naive_server.py", "naive_lambda.py"):
            shutil.copy(REPO_ROOT / "bench" / name, bundle / "bench" / name)
        subprocess.run([python, "-m", "compileall", "-q", str(bundle / "bench")], check=True)
        timings: dict[str, list[float]] = {"servestack.adapters.serverless": [], "bench.naive_lambda": []}
        for _ in range(args.runs):
            for module in timings:
                out = subprocess.run(
                    ["taskset", "-c", "0", python, "-I", "-S", "-c", TIMED_IMPORT.format(module=module), str(bundle)],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=scratch,
                ).stdout
                timings[module].append(float(out.rsplit("INIT ", 1)[1]))
    ours, naive = (statistics.median(timings[m]) for m in timings)
    print(f"Lambda bundle: {size / 1e6:.1f} MB unzipped")
    print(f"init from the bundle (python3.12 -I -S, .pyc present), median of {args.runs}:")
    print(f"  servestack servestack.adapters.serverless        {ours * 1000:6.0f} ms")
    print(f"  naive FastAPI + Mangum (same bundle)  {naive * 1000:6.0f} ms")
    print(f"  ratio {ours / naive:.2f}")


if __name__ == "__main__":
    main()
