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
