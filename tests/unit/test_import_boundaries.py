"""The layers hold: the core stays transport-free, the runtime adapters import only the core, and nothing but
the constructs pulls in the CDK."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

FORBIDDEN_IN_CORE = ("boto3", "botocore", "fastapi", "starlette", "mangum", "aws_cdk", "uvicorn")
SERVESTACK = REPO_ROOT / "servestack"
# What each layer of servestack may import of servestack itself (a prefix of the module name). The core imports
# only itself; the runtime adapters, which Lambda bundles and images carry, the core and themselves; nothing of
# the framework imports the example project's top-level packages.
LAYERS = {
    "servestack.inference": ("servestack.inference",),
    "servestack.adapters": ("servestack.inference", "servestack.adapters"),
}
# Every package of the repository: the framework, and the example project's own Python.
FIRST_PARTY = ("servestack", "handlers", "stacks", "app")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_files(package: str) -> list[Path]:
    base = REPO_ROOT.joinpath(*package.split("."))
    found = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    return [p for p in found if p.is_file() and "project_template" not in p.parts]


def imported_names(path: Path) -> set[str]:
    """Every module a file imports (`from a.b import c` gives a.b and a.b.c), lazily or under TYPE_CHECKING too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def imported_roots(package: str) -> dict[str, set[str]]:
    return {
        str(path.relative_to(REPO_ROOT)): {name.split(".")[0] for name in imported_names(path)}
        for path in python_files(package)
    }


def test_core_source_imports_no_transport_or_cloud_library() -> None:
    offenders = {
        path: sorted(roots & set(FORBIDDEN_IN_CORE))
        for path, roots in imported_roots("servestack.inference").items()
        if roots & set(FORBIDDEN_IN_CORE)
    }
    assert offenders == {}


def layer_violations(layer: str, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    offenders: dict[str, list[str]] = {}
    for path in python_files(layer):
        bad = sorted(
            name
            for name in imported_names(path)
            if name.split(".")[0] in FIRST_PARTY
            and name != "servestack"
            and not any(name == a or name.startswith(a + ".") for a in allowed)
        )
        if bad:
            offenders[str(path.relative_to(REPO_ROOT))] = bad
    return offenders


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_runtime_layer_imports_only_what_it_may(layer: str) -> None:
    # GIVEN every import of the layer's modules, lazy and TYPE_CHECKING ones included
    # THEN the core imports only itself, and the adapters only the core and themselves: no CLI, no local mode,
    # no constructs, no serving.yaml schema, and nothing of a project's own top-level packages
    assert layer_violations(layer, LAYERS[layer]) == {}


def test_the_layer_check_finds_an_adapter_importing_the_cli(tmp_path: Path) -> None:
    # GIVEN an adapter module that imports the CLI WHEN its names are read THEN the check would report it
    module = tmp_path / "adapter.py"
    module.write_text("from servestack.cli.main import main\nfrom servestack.inference.errors import E\n")
    names = imported_names(module)
    allowed = LAYERS["servestack.adapters"]
    assert sorted(n for n in names if not any(n == a or n.startswith(a + ".") for a in allowed)) == [
        "servestack.cli.main",
        "servestack.cli.main.main",
    ]


def test_importing_the_core_loads_no_transport_or_cloud_library() -> None:
    # GIVEN a fresh interpreter WHEN every serving module of the core is imported and a model loaded
    code = (
        "import sys, servestack.inference.service, servestack.inference.codecs, servestack.inference.runtime, "
        "servestack.inference.hooks, servestack.inference.packaging;"
        "from servestack.inference.service import ModelRepository;"
        "from servestack.inference.settings import ServingSettings;"
        "ModelRepository(ServingSettings()).load_all();"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN_IN_CORE!r}))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    # THEN none of the forbidden libraries is in sys.modules
    assert result.stdout.strip() == "[]"


def test_only_the_constructs_import_cdk() -> None:
    # GIVEN every module of servestack outside servestack.cdk (the CLI must start fast; bundles carry no CDK)
    offenders = [
        path
        for path, roots in imported_roots("servestack").items()
        if "aws_cdk" in roots and not path.startswith("servestack/cdk/")
    ]
    assert offenders == []


def resolve(name: str) -> str | None:
    """The first-party module `name` refers to (a module file, or a package's __init__), else None."""
    base = REPO_ROOT.joinpath(*name.split("."))
    if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
        return name
    return None


def import_graph() -> dict[str, set[str]]:
    """Every first-party import, wherever it is written: module level, inside functions (lazy imports) and
    under `if TYPE_CHECKING:`; a lazy import still ties two modules into one circle."""
    graph: dict[str, set[str]] = {}
    for package in FIRST_PARTY:
        for path in python_files(package):
            targets: set[str] = set()
            for name in imported_names(path):
                if name.split(".")[0] in FIRST_PARTY:
                    found = resolve(name) or resolve(name.rpartition(".")[0])
                    if found:
                        targets.add(found)
            graph[module_name(path)] = targets - {module_name(path)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles_among_first_party_modules() -> None:
    # GIVEN the import graph of servestack/ and the example project (app.py, handlers/, stacks/), lazy imports
    # included
    graph = import_graph()
    # WHEN its strongly connected components are computed THEN every module stands in no circle
    assert cycles(graph) == []


def test_the_circle_check_finds_a_circle() -> None:
    # GIVEN a graph with a lazy-import style circle a -> b -> a WHEN checked THEN the circle is reported
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_serving_code_never_imports_onnxruntime_quantization() -> None:
    # GIVEN every import of the runtime (the Lambda bundler deletes onnxruntime/quantization to save space,
    # servestack/cdk/bundling.py; only `servestack models optimize`, on the user's machine, uses it)
    offenders: dict[str, str] = {}
    for package in ("servestack.adapters", "servestack.inference", "handlers"):
        for path in python_files(package):
            for name in imported_names(path):
                if name.startswith(("onnxruntime.quantization", "onnxruntime.tools")):
                    offenders[str(path.relative_to(REPO_ROOT))] = name
    # THEN none of them names it
    assert offenders == {}
    # AND serving a model in a fresh interpreter loads neither it nor the onnx package it needs
    code = (
        "import sys; from servestack.inference.service import ModelRepository;"
        "from servestack.inference.settings import ServingSettings;"
        "import servestack.adapters.app; ModelRepository(ServingSettings()).load_all();"
        "print(sorted(m for m in sys.modules if m.startswith('onnxruntime.quantization') or m.split('.')[0] == 'onnx'))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_batch_jobs_start_up_imports_no_boto3_and_no_pyarrow() -> None:
    # GIVEN a fresh interpreter WHEN it does what `python -m servestack.adapters.batch` does before its first row of a
    # JSON Lines input: import the module, make its S3 client
    code = (
        "import sys, servestack.adapters.batch; servestack.adapters.batch.aws_client('s3');"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'boto3', 's3transfer', 'pyarrow', 'fastapi'}))"
    )
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True, env=env
    )
    # THEN neither boto3 (its s3transfer costs start-up, and no handler client needs it) nor pyarrow (Parquet only)
    # nor FastAPI is loaded
    assert result.stdout.strip() == "[]"


def test_the_serving_master_loads_no_model_runtime() -> None:
    # GIVEN a fresh interpreter that sees no GPU WHEN it does what the container's `serve` does before it starts
    # the workers: import the module, read its settings, count its workers
    code = (
        "import sys, servestack.adapters.realtime as r; r.ContainerSettings.from_environment();"
        "print(r.default_workers('auto'));"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'numpy', 'onnxruntime', 'fastapi'}"
        " or m == 'servestack.adapters.app'))"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    workers, loaded = result.stdout.splitlines()
    # THEN it counts one worker per core, and the master, which only starts and watches the workers, loaded none
    # of what each worker loads (the app, numpy, onnxruntime)
    assert int(workers) == len(os.sched_getaffinity(0))
    assert loaded == "[]"


def threads_after_importing(module: str, **environment: str) -> int:
    """The threads of a fresh interpreter once `module` is imported (numpy's BLAS starts its pool on import)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | environment
    code = f"import os, {module}; print(len(os.listdir('/proc/self/task')))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


@pytest.mark.skipif(
    not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2,
    reason="counts threads through Linux's /proc; OpenBLAS starts no pool on one core",
)
def test_a_handler_leaves_numpy_one_blas_thread_unless_the_environment_asks_for_more() -> None:
    # GIVEN a fresh interpreter; WHEN a handler is imported, with and without OPENBLAS_NUM_THREADS set
    default = threads_after_importing("servestack.adapters.batch")
    asked = threads_after_importing("servestack.adapters.batch", OPENBLAS_NUM_THREADS="4")
    # THEN by default numpy's BLAS starts no pool of its own; a user's setting still wins (OpenBLAS starts up
    # to the cores there are)
    assert asked > default


LOCAL = REPO_ROOT / "servestack" / "local"


def local_interfaces() -> dict[str, set[str]]:
    """Each package of local mode (`servestack/local/<service>/`) and its interface: the names its `__init__.py`
    lists in `__all__`."""
    interfaces: dict[str, set[str]] = {}
    for init in sorted(LOCAL.glob("*/__init__.py")):
        exported: set[str] = set()
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                assert isinstance(node.value, ast.List | ast.Tuple), f"{init}: __all__ is not a literal list"
                exported = {element.value for element in node.value.elts if isinstance(element, ast.Constant)}
        interfaces[init.parent.name] = exported
    return interfaces


def interface_violations(source: str, own: str | None, interfaces: dict[str, set[str]]) -> list[str]:
    """The imports in `source` (a module of package `own`, or None for a module of local/ itself) that reach into
    another local package's internals (`servestack.local.<other>.<module>`) or take a name its interface does not
    export; lazy imports and `if TYPE_CHECKING:` ones included."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[tuple[str, list[str]]] = []
        if isinstance(node, ast.Import):
            names = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [(node.module, [alias.name for alias in node.names])]
        for module, imported in names:
            parts = module.split(".")
            if parts[:2] != ["servestack", "local"] or len(parts) < 3 or parts[2] not in interfaces:
                continue
            package = parts[2]
            if package == own:
                continue
            if len(parts) > 3:
                found.append(f"{module} (an internal module of servestack.local.{package})")
                continue
            found += [f"{module}.{name} (not in its __all__)" for name in imported if name not in interfaces[package]]
    return found


def test_local_packages_import_one_another_only_through_their_interfaces() -> None:
    # GIVEN every module of servestack/local/ (each service package's, and local/'s own) and each package's
    # interface (its __init__'s __all__)
    interfaces = local_interfaces()
    assert {"cloudformation", "iam", "lambda_", "sagemaker", "scheduler"} <= set(interfaces)
    offenders: dict[str, list[str]] = {}
    for path in sorted(LOCAL.rglob("*.py")):
        parts = path.relative_to(LOCAL).parts
        own = parts[0] if len(parts) > 1 else None
        found = interface_violations(path.read_text(), own, interfaces)
        if found:
            offenders[str(path.relative_to(REPO_ROOT))] = found
    # THEN none imports another package's module, or a name that package does not export (tests may)
    assert offenders == {}


def test_the_interface_check_finds_an_import_of_internals() -> None:
    # GIVEN a module of package `a` that imports b's interface, b's internal module (one lazily), and a name b
    # does not export WHEN checked THEN the internal imports and the unexported name are reported
    source = (
        "from servestack.local.b import Exported\n"
        "from servestack.local.a.inner import Mine\n"
        "def later():\n    from servestack.local.b.inner import Hidden\n"
        "import servestack.local.b.inner\n"
        "from servestack.local.b import Unlisted\n"
    )
    assert sorted(interface_violations(source, "a", {"a": set(), "b": {"Exported"}})) == [
        "servestack.local.b.Unlisted (not in its __all__)",
        "servestack.local.b.inner (an internal module of servestack.local.b)",
        "servestack.local.b.inner (an internal module of servestack.local.b)",
    ]


def test_the_layout_page_and_the_size_limit_hold_for_every_local_package() -> None:
    # GIVEN the packages of servestack/local/ and the layout page that shows them to a newcomer
    local = REPO_ROOT / "servestack/local"
    packages = sorted(p.name for p in local.iterdir() if (p / "__init__.py").is_file())
    page = (REPO_ROOT / "docs/layout.md").read_text(encoding="utf-8")
    layout = page[page.index("## Local mode, by the AWS service it plays") :]
    # THEN the page has a row for each package, and no row for one that is gone
    assert [p for p in packages if f"| `{p}/` |" not in layout] == []
    rows = {line.split("`")[1].rstrip("/") for line in layout.splitlines() if line.startswith("| `")}
    assert rows - set(packages) == set()
    # AND no module of local mode is much over 500 lines (one module, one idea)
    sizes = {str(p.relative_to(REPO_ROOT)): len(p.read_text().splitlines()) for p in local.rglob("*.py")}
    assert {path: lines for path, lines in sizes.items() if lines > 520} == {}


def test_each_local_package_loads_exactly_its_interface_on_first_use() -> None:
    # GIVEN each package of local mode, whose interface is what its __init__ imports under `if TYPE_CHECKING:`
    # (loaded on first use) and lists in __all__
    from servestack.local import interface_sources

    interfaces = local_interfaces()
    packages = sorted(init.parent.name for init in LOCAL.glob("*/__init__.py"))
    # THEN the two lists agree
    for name in packages:
        assert set(interface_sources(LOCAL / name / "__init__.py")) == interfaces[name], name
    # AND in a fresh process, importing every package loads none of their modules; then each declared name
    # resolves to the object its module defines (a submodule where the interface names one)
    script = (
        "import importlib, sys\n"
        "from servestack.local import interface_sources\n"
        f"packages = [importlib.import_module('servestack.local.' + name) for name in {packages!r}]\n"
        "loaded = sorted(m for m in sys.modules if m.count('.') > 2 and m.startswith('servestack.local.'))\n"
        "assert loaded == [], loaded\n"
        "resolved = 0\n"
        "for package in packages:\n"
        "    for name, (module, attribute) in interface_sources(package.__file__).items():\n"
        "        if module == package.__name__:\n"
        "            expected = importlib.import_module(module + '.' + attribute)\n"
        "        else:\n"
        "            expected = getattr(importlib.import_module(module), attribute)\n"
        "        assert getattr(package, name) is expected, (package.__name__, name)\n"
        "        resolved += 1\n"
        "print(resolved)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) == sum(len(interfaces[name]) for name in packages)


def test_a_child_process_imports_only_the_packages_it_uses() -> None:
    # GIVEN a Lambda execution environment's entry point, which needs the Lambda runtime and the HTTP hosting
    # WHEN imported in a fresh process
    script = "import sys, servestack.local.lambda_.runner; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
                                check=True).stdout.split())  # fmt: skip
    # THEN it loads neither the CDK synth nor the IAM engine nor the emulator (local up's, not the function's)
    assert "servestack.local.lambda_.invoke" in loaded
    assert {m for m in loaded if m.startswith(("servestack.local.cloudformation.synth", "servestack.local.iam.",
                                               "servestack.local.emulator.", "moto"))} == set()  # fmt: skip
