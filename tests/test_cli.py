"""The command line, end to end, and its one-line errors for bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import cli, comparable

from clusterfed import config as cfg
from clusterfed.algorithms import ALGORITHMS
from clusterfed.run_folder import CHECKPOINT

SMALL = ["scenario.clients=8", "train.rounds=2", "run.progress=false"]


def test_presets_lists_quickstart(capsys):
    code, out, _ = cli(capsys, "presets")
    assert code == 0 and "quickstart" in out and "mnist-iid" in out


def test_run_writes_folder_and_report(capsys, tmp_path):
    code, out, err = cli(capsys, "run", "quickstart", *SMALL, "--out", str(tmp_path))
    assert code == 0, err
    assert "fedavg: mean accuracy" in out
    for name in ("config.yaml", "metrics.jsonl", "events.jsonl", "summary.json", "report.md",
                 "accuracy.png", "per_client.png", "clusters.png"):
        assert (tmp_path / name).exists(), name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds"] == 2 and len(summary["clustering"]["assignment"]) == 8


def test_compare_prints_table_and_writes_report(capsys, tmp_path):
    code, out, err = cli(capsys, "compare", "quickstart", *SMALL, "--out", str(tmp_path))
    assert code == 0, err
    header = out.splitlines()[0].split()
    assert header == ["algorithm", "mean", "acc", "ARI", "clusters", "seconds"]
    assert any(line.startswith("fedavg") for line in out.splitlines())
    assert any(line.startswith("local") and line.split()[3] == "8" for line in out.splitlines())
    comparison = json.loads((tmp_path / "comparison.json").read_text())
    # Every registered algorithm joins the main job.
    assert sorted(comparison["algorithms"]) == sorted(ALGORITHMS.names())
    assert comparison["algorithms"][:3] == ["fedavg", "local", "cfl"]
    # The main job shows defaults only: no algorithm carries an option of its own.
    assert json.loads((tmp_path / "cfl" / "summary.json").read_text())["algorithm"] == "cfl"
    assert all(isinstance(a, str) for a in cfg.resolve("quickstart")["compare"]["algorithms"])
    assert yaml.safe_load((tmp_path / "cfl" / "config.yaml").read_text())["algorithm"] == {
        "name": "cfl"}
    assert (tmp_path / "report.md").read_text().count("fedavg") >= 2
    assert (tmp_path / "local" / "report.md").exists()
    code, out, _ = cli(capsys, "compare", "quickstart", *SMALL, "--algorithms", "local,cfl",
                       "--out", str(tmp_path / "two"))
    assert code == 0 and "fedavg" not in out
    # A name asked for on the command line keeps the options the config gives it.
    from clusterfed.experiments.compare import algorithm_sections
    listed = {"compare": {"algorithms": ["local", {"name": "cfl", "min_child_size": 2}]}}
    assert algorithm_sections(listed, ["cfl"]) == [{"name": "cfl", "min_child_size": 2}]


@pytest.mark.parametrize("argv, message", [
    (["run", "quickstart", "algorithm.name=fedsgd"],
     "unknown algorithm 'fedsgd'; valid algorithms: "),
    (["run", "quickstart", "data.dataset=imagenet"], "unknown dataset 'imagenet'; valid datasets:"),
    (["run", "quickstart", "scenario.kind=blobs"], "unknown scenario 'blobs'; valid scenarios:"),
    (["run", "quickstart", "model.name=vit"], "unknown model 'vit'; valid models:"),
    (["run", "quickstart", "train.lrr=1"], "unknown config key train.lrr in section 'train'"),
    (["run", "quickstart", "scenario.angles=[0]"],
     "unknown config key scenario.angles in section 'scenario'"),
    (["run", "quickstart", "algorithm.k=3"],
     "unknown config key algorithm.k in section 'algorithm'"),
    (["run", "quickstart", "scenario.clusters=30"], "more than scenario.clients=20"),
    (["run", "quickstart", "train.participation=0"], "nothing is trained"),
    (["run", "quickstart", "scenario.clusters=6"], "needs 12 distinct labels"),
    (["run", "nope"], "unknown preset 'nope'"),
    (["compare", "quickstart", "--algorithms", "fedavg,nosuch"], "unknown algorithm 'nosuch'"),
    (["run"], "give a preset name or a config file"),
    (["run", "quickstart", "--resume", "x"], "--resume continues a run"),
])
def test_bad_input_gives_one_clear_line(capsys, tmp_path, argv, message):
    code, out, err = cli(capsys, *argv, "--out", str(tmp_path / "out"))
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    if "valid algorithms" in err:
        assert "fedavg" in err and "local" in err


def test_missing_data_file_names_file_checksum_and_where(capsys, tmp_path):
    code, _, err = cli(capsys, "run", "mnist-iid", "--data-dir", str(tmp_path / "empty"),
                       "--out", str(tmp_path / "out"))
    assert code == 2
    assert "missing data file" in err and "train-images-idx3-ubyte.gz" in err
    assert "6bbc9ace898e44ae57da46a324031adb" in err and "--data-dir" in err


def test_report_on_a_folder_that_is_not_a_run(capsys, tmp_path):
    code, _, err = cli(capsys, "report", str(tmp_path))
    assert code == 2 and "not a finished run" in err


def _cli_process(*argv: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "clusterfed", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_run_resumes_to_the_uninterrupted_summary(capsys, tmp_path):
    """SIGKILL a real run mid-way; --resume finishes it with the same numbers."""
    args = ["quickstart", "scenario.clients=8", "train.rounds=8", "run.checkpoint_every=1",
            "run.progress=false", "train.participation=0.5"]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    # Every run in its own process, so none inherits this process's torch settings.
    done = _cli_process("run", *args, "--out", str(whole))
    assert done.wait(timeout=300) == 0, done.communicate()[1][-500:]
    proc = _cli_process("run", *args, "--out", str(broken))
    metrics = broken / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        pytest.fail(f"the run ended before it could be killed: {proc.communicate()[1][-500:]}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (broken / "summary.json").exists()
    done = len(metrics.read_text().splitlines())
    assert 3 <= done < 8
    resumed = _cli_process("run", "--resume", str(broken))
    assert resumed.wait(timeout=300) == 0, resumed.communicate()[1][-500:]
    a = json.loads((whole / "summary.json").read_text())
    b = json.loads((broken / "summary.json").read_text())
    assert comparable(a) == comparable(b)
    assert metrics.read_text() == (whole / "metrics.jsonl").read_text()


def test_module_entry_point_reports_errors_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "clusterfed", "run", "quickstart",
                           "algorithm.name=nope"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: unknown algorithm 'nope'")


def test_run_into_a_cut_off_run_is_refused_unless_overwritten(capsys, tmp_path):
    """Starting over would delete the checkpoint of a run cut off before its end."""
    args = ["run", "quickstart", "scenario.clients=4", "train.rounds=2", "run.progress=false",
            "run.checkpoint_every=1", "--out", str(tmp_path)]
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    (tmp_path / "summary.json").unlink()          # as a run killed after its last checkpoint
    checkpoint = (tmp_path / CHECKPOINT).read_bytes()
    code, _, err = cli(capsys, *args)
    assert code != 0 and f"clusterfed run --resume {tmp_path}" in err
    assert (tmp_path / CHECKPOINT).read_bytes() == checkpoint
    code, _, err = cli(capsys, *args, "--overwrite")
    assert code == 0, err
    assert (tmp_path / "summary.json").exists()
    code, _, err = cli(capsys, *args)             # a finished run may be run again
    assert code == 0, err


def test_flower_local_into_a_cut_off_run_is_refused(capsys, tmp_path):
    pytest.importorskip("flwr", reason="Flower is not installed")
    (tmp_path / CHECKPOINT).write_bytes(b"a cut-off run's rounds")
    code, _, err = cli(capsys, "flower", "local", "quickstart", "--out", str(tmp_path))
    assert code != 0 and f"clusterfed flower local --resume {tmp_path}" in err
    assert (tmp_path / CHECKPOINT).read_bytes() == b"a cut-off run's rounds"
