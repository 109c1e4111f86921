"""`--jobs N`: reproduce, sweep and compare run N runs at a time in their own processes, with
the same figures as one at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import cli, tiny_config

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.experiments import reproduce as rep
from clusterfed.experiments.compare import compare
from clusterfed.experiments.resumable import Job, run_jobs, threads_per_job
from clusterfed.sim.processes import usable_cores


def small() -> dict:
    config = tiny_config("fedavg", train={"rounds": 2}, run={"checkpoint_every": 1})
    return cfg.merge(config, {"reproduce": {"seeds": [0, 1], "algorithms": ["fedavg", "local"]}})


def figures(result: dict) -> list:
    """Each row's figures without the wall times, as text (NaN equals NaN there)."""
    return [repr((r["label"], r["own"], r["cluster"], r["ari"], r["clusters"]))
            for r in result["rows"]]


def test_reproduce_in_two_processes_equals_one_at_a_time(tmp_path: Path):
    one = rep.reproduce(small(), tmp_path / "one")
    lines: list[str] = []
    two = rep.reproduce(small(), tmp_path / "two", jobs=2, progress=lines.append)
    assert figures(two) == figures(one)
    for label in ("fedavg", "local"):
        for seed in (0, 1):
            a, b = (json.loads((tmp_path / d / label / f"seed-{seed}" / "summary.json")
                               .read_text()) for d in ("one", "two"))
            assert a["final"]["per_client_accuracy"] == b["final"]["per_client_accuracy"]
            assert a["clustering"]["assignment"] == b["clustering"]["assignment"]
    # A run that sets no threads gets its share of the cores, recorded in its config.
    held = cfg.load_source(str(tmp_path / "two" / "fedavg" / "seed-0" / "config.yaml"))[1]
    assert held["run"]["threads"] == max(1, usable_cores() // 2)
    assert sorted(line.split(":")[0] for line in lines) == [
        "fedavg seed 0", "fedavg seed 1", "local seed 0", "local seed 1"]


def test_compare_and_sweep_in_two_processes_equal_one_at_a_time(tmp_path: Path):
    config = tiny_config("fedavg", train={"rounds": 2})
    a = compare(config, tmp_path / "c1", ["fedavg", "local"])
    b = compare(config, tmp_path / "c2", ["fedavg", "local"], jobs=2)
    for label in ("fedavg", "local"):
        assert a["summaries"][label]["final"] == b["summaries"][label]["final"]
    from clusterfed.experiments.sweep import run_sweep

    swept = cfg.merge(config, {"sweep": {"grid": {"train.lr": [0.05, 0.1]},
                                         "baseline": {"algorithm.name": "local"}}})
    lines: list[str] = []
    s1 = run_sweep(swept, tmp_path / "s1")
    s2 = run_sweep(swept, tmp_path / "s2", jobs=2, progress=lines.append)
    assert s1["rows"] == s2["rows"]
    assert sorted(lines) == ["baseline 000 (point 1)", "baseline 001 (point 2)",
                             "point 1 of 2: train.lr=0.05", "point 2 of 2: train.lr=0.1"]


def test_a_folder_of_another_config_is_refused_before_any_run_starts(tmp_path: Path):
    config = tiny_config("fedavg", train={"rounds": 2}, run={"checkpoint_every": 1})
    run_jobs([Job(cfg.merge(config, {"train": {"lr": 0.5}}), tmp_path / "a")], None)
    (tmp_path / "a" / "summary.json").unlink()   # cut off after its last checkpoint
    with pytest.raises(ConfigError, match="another config"):
        run_jobs([Job(config, tmp_path / "b"), Job(config, tmp_path / "a")], None, workers=2)
    assert not (tmp_path / "b").exists()


def test_a_run_failing_in_its_worker_is_the_commands_error_and_the_others_finish(
        tmp_path: Path):
    config = tiny_config("fedavg", train={"rounds": 2})
    broken = cfg.merge(config, {"algorithm": {"name": "cfl", "acceptance": "loose"}})
    with pytest.raises(ValueError, match="acceptance"):
        run_jobs([Job(broken, tmp_path / "a"), Job(config, tmp_path / "b")], None, workers=2)
    assert (tmp_path / "b" / "summary.json").exists()


def test_threads_per_job_shares_the_cores_only_where_a_run_sets_none():
    config = tiny_config("fedavg")
    assert threads_per_job(config, 1)["run"]["threads"] is None
    assert threads_per_job(config, 2)["run"]["threads"] == max(1, usable_cores() // 2)
    assert threads_per_job(config, 10 * usable_cores())["run"]["threads"] == 1
    set_ = cfg.merge(config, {"run": {"threads": 3}})
    assert threads_per_job(set_, 2)["run"]["threads"] == 3
    with pytest.raises(ConfigError, match="jobs"):
        run_jobs([], None, workers=0)


def test_the_command_line_takes_jobs(capsys, tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_text(cfg.dump(small()))
    code, out, err = cli(capsys, "reproduce", str(path), "--jobs", "2", "--out",
                         str(tmp_path / "r"))
    assert code == 0, err
    assert "| fedavg |" in out and "| local |" in out
    code, _, err = cli(capsys, "reproduce", str(path), "--jobs", "0")
    assert code != 0 and "--jobs" in err


def test_benchmark_cells_in_two_processes_equal_one_at_a_time(tmp_path: Path):
    from clusterfed.experiments import benchmark as bench

    def run(out: str, jobs: int) -> list:
        rows = bench.run_benchmark(tmp_path / out, datasets=["digits"],
                                   scenarios=["iid", "label_swap"], methods=["cfl", "ifca"],
                                   seeds=[0], overrides=["train.rounds=2", "run.threads=1"],
                                   jobs=jobs)
        return sorted(repr({k: v for k, v in r.items() if k != "seconds"}) for r in rows)

    assert run("b2", 2) == run("b1", 1)
    written = (tmp_path / "b2" / "results.jsonl").read_text().splitlines()
    assert len(written) == 4   # each cell appended as it finished
    with pytest.raises(ConfigError, match="jobs"):
        bench.run_benchmark(tmp_path / "b3", datasets=["digits"], scenarios=["iid"],
                            methods=["cfl"], seeds=[0], jobs=0)


def test_a_process_keeps_only_the_latest_federation():
    """Runs come grouped by (data, scenario, seed): the last one is reused, an earlier one is
    let go rather than held for the whole command."""
    from clusterfed.experiments.parallel import LatestFederation

    a = tiny_config("fedavg")
    b = cfg.merge(a, {"seed": 1})
    cache = LatestFederation()
    first = cache.get(a, None)
    assert cache.get(cfg.merge(a, {"algorithm": {"name": "local"}}), None) is first
    other = cache.get(b, None)
    assert other is not first and cache.get(b, None) is other
    assert cache.get(a, None) is not first          # rebuilt: the first was not kept
    cache.hold(b, "built elsewhere")
    assert cache.get(b, None) == "built elsewhere"
