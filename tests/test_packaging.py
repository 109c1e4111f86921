"""What the package declares: every third-party import of clusterfed/ is a dependency."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:   # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "clusterfed"
# Import names whose distribution is named otherwise; any other name is its own distribution.
DISTRIBUTION = {"yaml": "PyYAML", "sklearn": "scikit-learn", "PIL": "pillow"}
# Modules that only the Flower runtime imports, so they may come from the `flower` extra.
FLOWER_PART = PACKAGE / "flower"
# The experiment trackers' backends (run.loggers): each tracker's library is its own extra.
TRACKERS_PART = PACKAGE / "trackers"
TRACKER_EXTRAS = ("tensorboard", "mlflow", "wandb")
# The mlflow extra installs the client distribution, imported as `mlflow`.
DISTRIBUTION["mlflow"] = "mlflow-skinny"


def normalised(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """'flwr[simulation]>=1.41,<1.42' -> 'flwr'."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return normalised(match.group(1))


def optional_imports(tree: ast.AST) -> set[ast.AST]:
    """Import statements inside `try: ... except ImportError`: optional, with a fallback."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError",
                                                                 "ModuleNotFoundError")
                for h in node.handlers):
            guarded |= {n for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def third_party_imports(source: str) -> set[str]:
    """Top-level names of the absolute, unguarded imports in `source`, less the standard
    library's."""
    tree = ast.parse(source)
    optional = optional_imports(tree)
    names = set()
    for node in ast.walk(tree):
        if node in optional:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "clusterfed"}


def test_the_scan_sees_lazy_imports_and_skips_stdlib_and_optional_ones():
    source = ("import os, numpy.linalg\nfrom . import x\nfrom yaml import safe_load\n"
              "def f():\n    import tomli_w\n"
              "try:\n    import h5py\nexcept ImportError:\n    h5py = None\n")
    assert third_party_imports(source) == {"numpy", "yaml", "tomli_w"}


def test_every_third_party_import_is_declared_where_it_is_used():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {requirement_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    flower = core | {requirement_name(r) for r in extras["flower"]}
    trackers = core | {requirement_name(r) for x in TRACKER_EXTRAS for r in extras[x]}
    undeclared = []
    for path in sorted(PACKAGE.rglob("*.py")):
        declared = (flower if FLOWER_PART in path.parents
                    else trackers if TRACKERS_PART in path.parents else core)
        for name in sorted(third_party_imports(path.read_text())):
            if normalised(DISTRIBUTION.get(name, name)) not in declared:
                undeclared.append(f"{path.relative_to(REPO)}: {name}")
    assert not undeclared, "undeclared imports: " + ", ".join(undeclared)


def test_declared_flower_dependencies_are_pinned():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {requirement_name(line.split("==")[0]) for line in
            (REPO / "constraints.txt").read_text().splitlines()
            if "==" in line and not line.lstrip().startswith("#")}
    for extra in ("flower", "test", "hf", *TRACKER_EXTRAS):
        for requirement in project["optional-dependencies"][extra]:
            assert requirement_name(requirement) in pins, requirement


# Server code (every algorithm) on a machine without torch: a blocker refuses the import.
NO_TORCH = """
import importlib, importlib.abc, pkgutil, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch is not installed here")
sys.meta_path.insert(0, NoTorch())
import clusterfed.algorithms as algorithms
for module in pkgutil.iter_modules(algorithms.__path__):
    importlib.import_module("clusterfed.algorithms." + module.name)
from clusterfed.algorithms import ALGORITHMS
print(len(ALGORITHMS.names()))
"""


def test_the_algorithms_import_without_torch():
    import subprocess

    done = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) >= 12


# What each module may not load: the report and the run folder readers read files without the
# simulator (nor torch); the algorithms plan without matplotlib. clusterfed.flower.node,
# client_app, executor and server_app still build through clusterfed.sim.simulation.
IMPORT_LIMITS = {
    "clusterfed.report.pages": ("clusterfed.sim.simulation", "torch"),
    "clusterfed.run_folder": ("clusterfed.sim", "torch"),
    "clusterfed.experiments.compare": ("clusterfed.sim.simulation", "torch"),
    "clusterfed.flower.launch": ("clusterfed.sim", "torch"),
    "clusterfed.flower.wire": ("clusterfed.sim", "torch"),
    "clusterfed.algorithms": ("matplotlib", "torch", "clusterfed.sim"),
}


@pytest.mark.parametrize("module", sorted(IMPORT_LIMITS))
def test_a_module_does_not_load_what_it_should_not(module):
    import subprocess

    code = (f"import sys, {module}; print(' '.join(m for m in {IMPORT_LIMITS[module]!r} "
            f"if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""


# The floors of the package, lowest first: a module imports its own room and the rooms of lower
# floors, never a higher floor nor another room of its own floor (docs/design.md, "The map").
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("clusterfed", "registry", "state", "strict_json", "tasks", "sampling"),
    ("clustering",),
    ("algorithms", "data", "models"),       # an algorithm sees no data and no model
    ("client", "config"),
    ("run_folder",),
    ("report",),                            # with each method's report.py
    ("trackers",),
    ("sim",),
    ("experiments", "flower"),
    ("cli", "docs_gen"),
    ("__main__",),
)
# Rooms kept apart across floors: the client side runs no server logic.
APART = {("client", "algorithms")}
# Within the algorithms: a method's folder imports the shared modules (algorithms/*.py) and
# itself; these methods also extend another's class.
BUILDS_ON = {"fedavg_ft": "fedavg", "fednova": "fedavg", "fedprox": "fedavg",
             "per_fedavg": "fedavg", "fedrc": "fedem"}
# Above the algorithms a method is reached through the registry; these modules name methods:
# Flower strategies for CFL, FeSEM, FlexCFL, FL+HC and IFCA.
NAMES_METHODS = {"clusterfed.flower.strategies"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(source: str, module: str, is_package: bool, modules: set[str]
                    ) -> list[tuple[int, str]]:
    """(line, imported module) of every import of `module` (lazy ones inside functions too)
    that names a module of `modules`' package: `from a import b` is a.b where that is a module,
    relative imports resolved."""
    package = module.split(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[:len(module.split(".")) - node.level + is_package]
                base = ".".join(parts + ([base] if base else []))
            found += [(node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
                      for a in node.names]
    return sorted({(line, name) for line, name in found if name.split(".")[0] == package})


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 4 and parts[1] == "algorithms" and parts[3] == "report":
        return "report"   # drawn when a report is written, not when the method runs
    return parts[1] if len(parts) > 1 else parts[0]


def method(module: str, methods: set[str]) -> str | None:
    """The method folder `module` belongs to, None outside them."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "algorithms" and parts[2] in methods \
        else None


def wrong_import(importer: str, imported: str, methods: set[str]) -> str | None:
    """Why `importer` may not import `imported`, or None."""
    floor = {name: i for i, names in enumerate(FLOORS) for name in names}
    a, b = room(importer), room(imported)
    mine, theirs = method(importer, methods), method(imported, methods)
    if a != b:
        if b not in floor or a not in floor:
            return f"{b if b not in floor else a} is on no floor (add it to FLOORS)"
        if floor[b] >= floor[a]:
            return f"{a} (floor {floor[a]}) may not import {b} (floor {floor[b]})"
        if (a, b) in APART:
            return f"{a} may not import {b}"
        if theirs and theirs != mine and importer not in NAMES_METHODS:
            return f"{a} reaches method {theirs} through the registry, not by import"
        return None
    if a != "algorithms" or importer == "clusterfed.algorithms":   # its __init__ registers all
        return None
    if theirs is None or theirs == mine or BUILDS_ON.get(mine or "") == theirs:
        return None
    return (f"the shared {importer} may not import method {theirs}" if mine is None else
            f"method {mine} may not import method {theirs}")


def upward_imports(root: Path) -> list[str]:
    """Every import of the package under `root` that `wrong_import` refuses, as
    'path:line: module imports module: why'."""
    paths = sorted((root / "clusterfed").rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    methods = {p.parent.name for p in paths
               if p.name == "__init__.py" and p.parent.parent.name == "algorithms"}
    out = []
    for path in paths:
        module = module_name(path, root)
        for line, imported in package_imports(path.read_text(), module,
                                              path.name == "__init__.py", modules):
            why = wrong_import(module, imported, methods)
            if why:
                out.append(f"{path.relative_to(root)}:{line}: {module} imports {imported}: {why}")
    return out


@pytest.mark.fast
def test_the_layer_scan_resolves_relative_lazy_and_from_imports(tmp_path):
    files = {"clusterfed/__init__.py": "",
             "clusterfed/errors.py": "",
             "clusterfed/tasks.py": "from . import errors\n",
             "clusterfed/client/__init__.py": "",
             "clusterfed/client/work.py": "def f():\n    from ..algorithms.ifca import x\n",
             "clusterfed/algorithms/__init__.py": "from clusterfed.algorithms import ifca, fedem\n",
             "clusterfed/algorithms/base.py": "from clusterfed import tasks\n",
             "clusterfed/algorithms/ifca/__init__.py": "from clusterfed.sim import run\n",
             "clusterfed/algorithms/fedem/__init__.py": "import clusterfed.algorithms.ifca\n",
             "clusterfed/algorithms/fedrc/__init__.py": "from ..fedem import FedEM\n",
             "clusterfed/algorithms/ifca/report.py": "from clusterfed.run_folder import r\n",
             "clusterfed/sim/__init__.py": "from clusterfed import algorithms\n",
             "clusterfed/sim/gaps.py": "from clusterfed.algorithms.ifca import base\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = [line.split(": ", 1)[0] + ": " + line.rsplit(": ", 1)[1]
             for line in upward_imports(tmp_path)]
    assert found == [
        "clusterfed/algorithms/fedem/__init__.py:1: method fedem may not import method ifca",
        "clusterfed/algorithms/ifca/__init__.py:1: algorithms (floor 3) may not import sim "
        "(floor 8)",
        "clusterfed/client/work.py:2: client may not import algorithms",
        "clusterfed/sim/gaps.py:1: sim reaches method ifca through the registry, not by import"]


@pytest.mark.fast
def test_no_module_imports_from_a_higher_floor():
    wrong = upward_imports(REPO)
    assert not wrong, "imports against the floors:\n" + "\n".join(wrong)
