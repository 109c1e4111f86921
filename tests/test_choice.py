"""Which executor and how many threads a run uses (sim/choice.py): a script without a main guard
gets the CLI's workers, small models compute with one thread a process, and the run says what
it chose."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import cli, tiny_config
from torch import nn

from clusterfed.config import resolve
from clusterfed.data import build_federation, load_dataset
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.choice import (
    MAX_STEP_FLOPS_FOR_ONE_THREAD,
    Workload,
    auto_kind,
    build_executor,
    choice_log,
    choose,
    run_threads,
)
from clusterfed.sim.processes import start_obstacle

CPU = torch.device("cpu")
SMALL = ["scenario.clients=8", "train.rounds=1", "run.progress=false"]


def small(step_flops: float, cores: int = 2, obstacle: str | None = None,
          fixable: bool = False) -> Workload:
    return Workload(20, 8000, cores, obstacle, None, step_flops, 50.0, fixable)


def test_small_steps_compute_with_one_thread_unless_run_threads_says_otherwise():
    assert run_threads({"threads": None}, CPU, small(6e6)) == 1
    assert run_threads({"threads": None}, CPU, small(MAX_STEP_FLOPS_FOR_ONE_THREAD)) == 1
    assert run_threads({"threads": 3}, CPU, small(6e6)) == 3        # the user's word
    assert run_threads({"threads": None}, CPU, small(4e9)) is None   # large steps: torch's
    assert run_threads({"threads": None}, torch.device("cuda"), small(6e6)) is None
    assert run_threads({"threads": None}, CPU, None) is None         # nothing weighed


def test_a_script_without_a_guard_still_starts_workers_for_a_registered_model(
        monkeypatch, tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text("run_config(cfg)\n")
    main = types.ModuleType("__main__")
    main.__file__, main.__spec__ = str(script), None
    monkeypatch.setitem(sys.modules, "__main__", main)
    # The workers need nothing of the script: they start without it.
    assert start_obstacle(build_model("digits_cnn", (1, 8, 8), 10)) is None

    # A model class defined in the script needs it: the workers would run the script again.
    class Scripted(nn.Sequential):
        pass
    Scripted.__module__, Scripted.__qualname__ = "__main__", "Scripted"
    main.Scripted = Scripted
    scripted = Scripted(nn.Flatten(), nn.Linear(64, 10))
    assert "guard" in start_obstacle(scripted)
    script.write_text("if __name__ == '__main__':\n    run_config(cfg)\n")
    assert start_obstacle(scripted) is None


def test_a_fixable_obstacle_groups_in_this_process_with_one_thread_and_warns(
        monkeypatch, tmp_path, caplog):
    assert auto_kind(CPU, small(6e6, obstacle="no guard", fixable=True))[0] == "grouped"
    assert auto_kind(CPU, small(6e6, obstacle="dropout"))[0] == "sequential"
    script = tmp_path / "unguarded.py"
    script.write_text("run_config(cfg)\n")
    main = types.ModuleType("__main__")
    main.__file__, main.__spec__ = str(script), None
    monkeypatch.setitem(sys.modules, "__main__", main)

    class ScriptedReLU(nn.ReLU):       # one layer of the model defined in the script
        pass
    ScriptedReLU.__module__, ScriptedReLU.__qualname__ = "__main__", "ScriptedReLU"
    main.ScriptedReLU = ScriptedReLU
    module = build_model("digits_cnn", (1, 8, 8), 10)
    module[2] = ScriptedReLU()
    assert "guard" in start_obstacle(module)
    config = resolve(tiny_config(train={"participation": 1.0, "local_epochs": 3}))
    federation = build_federation(load_dataset("digits"), config["scenario"], config["seed"])
    model = FlatModel(module)
    choice = choose(config["run"], model, federation, config["train"], threads_budget=2)
    assert (choice.kind, choice.workers, choice.threads) == ("grouped", 1, 1), choice
    caplog.set_level(logging.INFO, logger="clusterfed")
    build_executor(choice, model, federation, 0, None, 0.0)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert choice.work is not None and choice.work.fixable
    if choice.work.cores > 1:      # the run could have used more cores: it says how
        assert len(warned) == 1 and "__main__" in warned[0] and "one of" in warned[0]


def test_the_cli_says_which_executor_and_threads_it_chose(capsys, caplog, tmp_path):
    try:
        code, _, err = cli(capsys, "run", "quickstart", *SMALL, "--out", str(tmp_path))
    finally:
        choice_log.setLevel(logging.NOTSET)   # the CLI's setting, not the later tests'
    assert code == 0, err
    lines = [r.getMessage() for r in caplog.records if r.name == "clusterfed.executor"]
    assert len(lines) == 1 and lines[0].startswith("executor: ") and "thread" in lines[0]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_the_readme_example_without_a_guard_runs_the_clis_workers(tmp_path):
    # The README's Python example as a script, without `if __name__ == "__main__":`.
    script = tmp_path / "example.py"
    script.write_text(
        "import logging\n"
        "from pathlib import Path\n"
        "logging.basicConfig(level=logging.INFO)\n"
        f"with open({str(tmp_path / 'ran')!r}, 'a') as f:\n"
        "    f.write('x')\n"
        "from clusterfed import config\n"
        "from clusterfed.sim.simulation import run_config\n"
        "cfg = config.resolve('quickstart', ['scenario.clients=8', 'train.rounds=1',\n"
        "                     'run.progress=false'])\n"
        "run_config(cfg)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "worker processes of 1 thread" in done.stderr
    assert (tmp_path / "ran").read_text() == "x"       # the script ran once, not per worker
    assert Path(tmp_path).exists()


def test_flower_local_says_which_settings_give_its_figures():
    from clusterfed.flower.launch import simulator_note

    config = resolve(tiny_config(train={"participation": 1.0}))
    assert "run.executor=processes" in simulator_note(config, None)   # auto groups: a note
    for run in ({"executor": "processes"}, {"executor": "sequential", "threads": 1}):
        assert simulator_note(resolve(tiny_config(train={"participation": 1.0}, run=run)),
                              None) is None
    two = resolve(tiny_config(run={"executor": "sequential", "threads": 2}))
    assert "2 threads" in simulator_note(two, None)
