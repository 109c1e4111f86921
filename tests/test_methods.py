"""One folder per method: a method is its folder plus one registration, and nothing else.

A toy method built in a temporary package (its algorithm, a preset and a report section, in
its own folder) must run from its preset and get its report section, with no file of clusterfed
touched; the project's own methods must follow the same rule.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clusterfed import config as cfg
from clusterfed.algorithms import ALGORITHMS
from clusterfed.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
ALGORITHMS_DIR = REPO / "clusterfed" / "algorithms"

TOY_ALGORITHM = '''
"""A toy method: FedAvg under its own name, to show what adding a method takes."""
from clusterfed.algorithms.base import ALGORITHMS
from clusterfed.algorithms.fedavg.algorithm import FedAvg


@ALGORITHMS.register("toy", report=".report")
class Toy(FedAvg):
    pass
'''
TOY_REPORT = '''
def run_section(folder, summary, metrics):
    return ["## Toy", "", f"toy section: {len(metrics)} records", ""]


def comparison_section(folder, runs):
    return ["## Toy against the others", "", f"toy compared with {len(runs) - 1} runs", ""]
'''
TOY_PRESET = '''# A toy preset: found from the toy method's folder.
seed: 1
data: {dataset: digits}
scenario: {kind: label_swap, clients: 4, clusters: 2}
model: {name: mlp, hidden: [8]}
train: {rounds: 2, batch_size: 32}
algorithm: {name: toy}
compare: {algorithms: [toy, fedavg]}
run: {progress: false, checkpoint_every: 0}
'''
# The one registration line: importing the folder registers the method (a user's own package
# does this; clusterfed's methods are the import list in clusterfed/algorithms/__init__.py).
TOY_RUN = '''
import sys
from pathlib import Path

import toy_method  # noqa: F401  the one registry line
from clusterfed import config as cfg
from clusterfed.experiments.compare import compare
from clusterfed.report import write_report
from clusterfed.sim.simulation import run_config

out = Path(sys.argv[1])
assert "toy-quick" in cfg.preset_names()
config = cfg.resolve("toy-quick")
summary = run_config(config, out / "run")
assert summary["algorithm"] == "toy"
print(write_report(out / "run").read_text())
compare(config, out / "comparison")
print(write_report(out / "comparison").read_text())
'''


def make_toy_method(root: Path) -> None:
    folder = root / "toy_method"
    (folder / "presets").mkdir(parents=True)
    (folder / "__init__.py").write_text("from toy_method.algorithm import Toy  # noqa: F401\n")
    (folder / "algorithm.py").write_text(textwrap.dedent(TOY_ALGORITHM))
    (folder / "report.py").write_text(textwrap.dedent(TOY_REPORT))
    (folder / "presets" / "toy-quick.yaml").write_text(TOY_PRESET)


def test_a_new_method_is_one_folder_and_one_registration(tmp_path: Path) -> None:
    make_toy_method(tmp_path / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "src"), str(REPO)]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", TOY_RUN, str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_page, comparison_page = done.stdout.split("# Comparison")
    assert "# toy: 2 rounds" in run_page
    assert "toy section: 2 records" in run_page          # its run section, from its folder
    assert "toy compared with 1 runs" in comparison_page  # its comparison section
    assert "[toy](toy/report.md)" in comparison_page


def test_every_method_folder_holds_one_registered_method() -> None:
    folders = {p.name for p in ALGORITHMS_DIR.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(ALGORITHMS.names())
    for name in ALGORITHMS.names():
        method = ALGORITHMS.method(name)
        assert method.package == f"clusterfed.algorithms.{name}"
        assert (ALGORITHMS_DIR / name / "algorithm.py").exists()
        report = ALGORITHMS_DIR / name / "report.py"
        assert (method.report == ".report") == report.exists(), name
        if report.exists():
            assert callable(ALGORITHMS.report_module(name).run_section)


def test_every_preset_of_a_method_folder_runs_that_method() -> None:
    general = {p.stem for p in cfg.presets_dir().glob("*.yaml")}
    for name, path in cfg.preset_paths().items():
        raw = cfg.load_source(name)[1]
        if name in general:
            continue
        method = path.parent.parent.name
        listed = [e if isinstance(e, str) else e["name"]
                  for e in raw.get("compare", {}).get("algorithms", [])]
        assert raw["algorithm"]["name"] == method or method in listed, name


def test_a_preset_defined_twice_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "cfl-congruence.yaml").write_text("seed: 0\n")   # also in cfl's folder
    monkeypatch.setattr(cfg, "presets_dir", lambda: tmp_path)
    with pytest.raises(ConfigError, match="cfl-congruence.*defined twice"):
        cfg.preset_paths()
