"""FL+HC's presets and grids, the sweep command, the FL+HC report sections."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import cli, tiny_config

from clusterfed import config as cfg
from clusterfed.algorithms import build_algorithm
from clusterfed.algorithms.flhc.report import comparison_rows, cut_rule, ratio
from clusterfed.errors import ConfigError
from clusterfed.experiments.compare import compare
from clusterfed.experiments.sweep import (
    format_sweep_table,
    grid_points,
    point_configs,
    round_of,
    run_sweep,
)
from clusterfed.report import write_report
from clusterfed.sim.simulation import build_federation_for, run_config

SETTINGS = ["iid", "pathological", "labelswap"]
PRESETS = [f"flhc-mnist-{s}{v}" for s in SETTINGS for v in ("", "-small")] + [
    "flhc-femnist", "flhc-femnist-small"]
GRIDS = ["flhc-grid-a", "flhc-grid-b"]


@pytest.mark.parametrize("name", PRESETS + GRIDS)
def test_presets_resolve_and_build_their_algorithm(name):
    config = cfg.resolve(name)
    assert config["algorithm"]["name"] == "flhc"
    build_algorithm(config["algorithm"])
    target = 0.8 if "femnist" in name else 0.99
    assert config["eval"]["target_accuracy"] == target
    assert config["train"]["rounds"] == 50 and config["train"]["participation"] == 0.2
    assert config["train"]["batch_size"] == 10 and config["train"]["lr"] == 0.1


def test_paper_scale_presets_use_the_papers_settings():
    for name in PRESETS[::2][:3]:
        c = cfg.resolve(name)
        assert (c["scenario"]["clients"], c["scenario"]["samples_per_client"]) == (100, 600)
        assert c["model"]["name"] == "fedavg_cnn" and c["train"]["local_epochs"] == 3
        assert (c["algorithm"]["metric"], c["algorithm"]["linkage"],
                c["algorithm"]["threshold"]) == ("l2", "ward", 3.0)
    femnist = cfg.resolve("flhc-femnist")
    assert femnist["scenario"]["clients"] == 367 and femnist["algorithm"]["threshold"] == 10.0


def test_grid_a_is_c_by_n_and_grid_b_the_ten_pairings_by_tau():
    a = grid_points(cfg.resolve("flhc-grid-a")["sweep"])
    assert len(a) == 16
    assert {(p["train.participation"], p["algorithm.rounds_before_clustering"]) for p in a} == {
        (c, n) for c in (0.1, 0.2, 0.5, 1.0) for n in (1, 3, 5, 10)}
    b_config = cfg.resolve("flhc-grid-b")
    pairs = {(p["algorithm.metric"], p["algorithm.linkage"])
             for p in grid_points(b_config["sweep"])}
    assert len(pairs) == 10 and ("l2", "ward") in pairs and ("l1", "ward") not in pairs
    for _, run_cfg in point_configs(b_config):   # every point is a valid configuration
        build_algorithm(run_cfg["algorithm"])
        assert run_cfg["sweep"] == {}


@pytest.mark.shared_data
def test_the_small_label_swap_federation_has_four_groups_of_25(shared_data):
    config = cfg.resolve("flhc-mnist-labelswap-small", [f"data.root={shared_data}"])
    federation = build_federation_for(config)
    assert federation.num_clients == 100
    assert np.bincount(federation.true_clusters).tolist() == [25, 25, 25, 25]
    assert set(federation.train_sizes().tolist()) == {100}


def test_femnist_preset_needs_the_leaf_files(tmp_path):
    from clusterfed.errors import DataError

    config = cfg.resolve("flhc-femnist-small", [f"data.root={tmp_path}"])
    with pytest.raises(DataError, match="FEMNIST"):
        build_federation_for(config)


def test_round_rules():
    c = cfg.resolve(tiny_config("flhc"), ["algorithm.rounds_before_clustering=3"])
    assert round_of("last", c) == c["train"]["rounds"]
    assert round_of(7, c) == 7
    assert round_of("algorithm.rounds_before_clustering+1", c) == 4
    with pytest.raises(cfg.ConfigError):
        round_of("algorithm.nothing+1", c)


def sweep_config():
    base = tiny_config("flhc", train={"rounds": 3, "participation": 0.5},
                       eval={"target_accuracy": 0.5}, run={"checkpoint_every": 0})
    return cfg.merge(cfg.merge(base, {"algorithm": {
        "name": "flhc", "rounds_before_clustering": 1, "threshold_mode": "clusters",
        "threshold": 4}}), {"sweep": {
            "grid": {"algorithm.threshold": [1, 4]},
            "cases": [{"algorithm.metric": "cosine", "algorithm.linkage": "average"}],
            "baseline": {"algorithm.name": "fedavg"},
            "rounds": {"post-cluster": "algorithm.rounds_before_clustering+1",
                       "last": "last"},
            "labels": {"algorithm.metric": "dist"}}})


def test_sweep_runs_every_point_once_and_tabulates_ratios_to_a_shared_baseline(tmp_path):
    result = run_sweep(sweep_config(), tmp_path / "sweep")
    assert len(result["rows"]) == 2
    # One baseline for both points: FedAvg ignores the swept FL+HC options.
    assert {r["baseline"] for r in result["rows"]} == {"baselines/000"}
    assert not (tmp_path / "sweep" / "baselines" / "001").exists()
    for row in result["rows"]:
        summary = json.loads((tmp_path / "sweep" / row["run"] / "summary.json").read_text())
        assert summary["clustering"]["n_clusters"] == row["values"]["algorithm.threshold"]
        cell = row["columns"]["post-cluster"]
        assert cell["round"] == 2
        records = [json.loads(line) for line in
                   (tmp_path / "sweep" / row["run"] / "metrics.jsonl").read_text().splitlines()]
        assert cell["mean_accuracy"] == records[1]["mean_accuracy"]
    table = (tmp_path / "sweep" / "table.md").read_text()
    assert table.startswith("| dist | linkage | threshold | test acc post-cluster")
    assert table.count("\n| cosine | average |") == 2 and "x)" in table


def test_a_rerun_sweep_reads_finished_runs_back_and_runs_only_what_is_missing(tmp_path,
                                                                            monkeypatch):
    import clusterfed.experiments.resumable as resumable

    first = run_sweep(sweep_config(), tmp_path / "sweep")
    ran: list[str] = []
    real = resumable.run_config

    def counted(config, folder, **kw):
        ran.append(Path(folder).relative_to(tmp_path / "sweep").as_posix())
        return real(config, folder, **kw)

    monkeypatch.setattr(resumable, "run_config", counted)
    (tmp_path / "sweep" / "points" / "001" / "summary.json").unlink()   # cut off
    lines: list[str] = []
    again = run_sweep(sweep_config(), tmp_path / "sweep", progress=lines.append)
    assert ran == ["points/001"]
    assert lines == ["point 2 of 2: algorithm.metric=cosine algorithm.linkage=average "
                     "algorithm.threshold=4"]   # a line as a run starts
    assert again["rows"] == first["rows"]
    # Another evaluation would read other rounds: the folder is refused, not reused.
    other = cfg.merge(sweep_config(), {"eval": {"target_accuracy": 0.9}})
    with pytest.raises(ConfigError, match="another config .*eval"):
        run_sweep(other, tmp_path / "sweep")


def test_sweep_finished_tabulates_the_finished_points_and_runs_nothing(tmp_path, monkeypatch,
                                                                      capsys):
    import clusterfed.experiments.resumable as resumable
    import clusterfed.sim.simulation as simulation

    first = run_sweep(sweep_config(), tmp_path / "sweep")
    (tmp_path / "sweep" / "points" / "001" / "summary.json").unlink()   # still running
    monkeypatch.setattr(resumable, "run_config", lambda *a, **k: pytest.fail("ran"))
    monkeypatch.setattr(resumable, "resume_run", lambda *a, **k: pytest.fail("resumed"))
    monkeypatch.setattr(simulation, "build_federation_for", lambda *a, **k: pytest.fail("built"))
    ran = (tmp_path / "sweep" / "config.yaml").read_text()
    partial = run_sweep(cfg.merge(sweep_config(), {"run": {"threads": 2}}), tmp_path / "sweep",
                        finished_only=True)
    assert (tmp_path / "sweep" / "config.yaml").read_text() == ran   # the record of what ran
    assert partial["rows"] == first["rows"][:1]
    assert partial["missing"] == [first["rows"][1]["values"]]
    table = (tmp_path / "sweep" / "table.md").read_text()
    assert table.count("\n| cosine | average |") == 1
    assert "Not finished yet: algorithm.metric=cosine algorithm.linkage=average " \
           "algorithm.threshold=4." in table
    code, _, err = cli(capsys, "sweep", "flhc-grid-a", "--finished")
    assert code != 0 and "--out" in err


def test_best_over_keeps_the_best_point_per_group():
    rows = [{"values": {"m": m, "t": t}, "columns": {"last": {"mean_accuracy": acc}}}
            for m, t, acc in [("a", 1, 0.5), ("a", 2, 0.7), ("b", 1, 0.9), ("b", 2, 0.6)]]
    table = format_sweep_table({"rows": rows, "rounds": {"last": "last"}, "best_over": "t"})
    lines = [line for line in table.splitlines() if line.startswith("| a") or
             line.startswith("| b")]
    assert lines == ["| a | 2 | 70.0 |", "| b | 1 | 90.0 |"]


def test_best_over_on_validation_data_says_so():
    rows = [{"values": {"lr": lr}, "columns": {"last": {"mean_accuracy": acc}}}
            for lr, acc in [(0.1, 0.5), (0.01, 0.7)]]
    table = format_sweep_table({"rows": rows, "rounds": {"last": "last"}, "best_over": "lr",
                                "split": "validation"})
    assert "| lr | validation acc last |" in table and "| 0.01 | 70.0 |" in table
    assert "| 0.1 |" not in table and "held-out training data, not test" in table


def test_a_key_only_some_cases_set_has_its_column():
    rows = [{"values": values, "columns": {"last": {"mean_accuracy": acc}}}
            for values, acc in [({"name": "fedavg", "lr": 0.1}, 0.5),
                                ({"name": "fedprox", "mu": 0.01, "lr": 0.1}, 0.6)]]
    table = format_sweep_table({"rows": rows, "rounds": {"last": "last"}})
    assert "| name | lr | mu | test acc last |" in table
    assert "| fedavg | 0.1 |  | 50.0 |" in table and "| fedprox | 0.1 | 0.01 | 60.0 |" in table


def test_a_sweep_mixing_test_and_validation_figures_is_refused(tmp_path):
    config = cfg.merge(tiny_config("fedavg", eval={"validation_fraction": 0.2}),
                       {"sweep": {"grid": {"eval.split": ["test", "validation"]}}})
    with pytest.raises(ConfigError, match="scored on one eval.split; got"):
        run_sweep(config, tmp_path)
    assert not (tmp_path / "points").exists()


def test_sweep_cli_lists_the_grid(capsys):
    code, out, _ = cli(capsys, "sweep", "flhc-grid-a", "--list")
    assert code == 0 and len(out.splitlines()) == 16
    assert "train.participation=0.1 algorithm.rounds_before_clustering=1" in out


def test_ratio_as_the_paper_prints_it():
    assert ratio(0.9, 0.6) == "1.50x" and ratio(0.5, 0.0) == "-" and ratio(None, 1) == "n/a"


def test_flhc_run_and_comparison_reports(tmp_path):
    config = cfg.merge(tiny_config("flhc", train={"rounds": 3, "participation": 0.5},
                                   eval={"target_accuracy": 0.6}, run={"checkpoint_every": 0}),
                       {"algorithm": {"name": "flhc", "rounds_before_clustering": 1,
                                      "threshold_mode": "clusters", "threshold": 4}})
    comparison = compare(config, tmp_path / "cmp", ["fedavg", "flhc"])
    report = write_report(tmp_path / "cmp").read_text()
    assert "## FL+HC against FL (FedAvg)" in report
    assert (tmp_path / "cmp" / "flhc_vs_fedavg.png").exists()
    own = (tmp_path / "cmp" / "flhc" / "report.md").read_text()
    assert "clusters: 4" in own and (tmp_path / "cmp" / "flhc" / "flhc_dendrogram.png").exists()
    runs = {n: [json.loads(x) for x in (tmp_path / "cmp" / n / "metrics.jsonl").read_text()
                .splitlines()] for n in ("fedavg", "flhc")}
    rows = comparison_rows(runs["fedavg"], runs["flhc"])
    assert [r["round"] for r in rows] == [2, 3]
    fl = comparison["summaries"]["fedavg"]["final"]["mean_accuracy"]
    hc = comparison["summaries"]["flhc"]["final"]["mean_accuracy"]
    assert rows[1]["accuracy_ratio"] == ratio(hc, fl)
    assert rows[0]["fedavg"]["mean_accuracy"] == runs["fedavg"][1]["mean_accuracy"]


def test_the_report_names_the_rule_that_cut_the_tree(tmp_path):
    assert cut_rule({"threshold": 3.0, "threshold_mode": "absolute", "k_choice": None}) == \
        "threshold 3.0 (absolute)"
    assert cut_rule({"threshold": None, "threshold_mode": "k_choice",
                     "k_choice": {"k": 4, "selector": "silhouette"}}) == "cut into k_choice.k = 4"
    config = cfg.merge(tiny_config("flhc", train={"rounds": 3}, run={"checkpoint_every": 0}),
                       {"algorithm": {"name": "flhc", "rounds_before_clustering": 1}})
    run_config(config, tmp_path / "run")
    report = write_report(tmp_path / "run").read_text()
    assert "K by the k_choice selector silhouette_gap_width, cut at height none" in report


def test_a_run_that_never_clusters_reports_so(tmp_path):
    config = tiny_config("flhc", train={"rounds": 2}, run={"checkpoint_every": 0})
    run_config(config, tmp_path / "run")
    assert "No clustering round took place" in write_report(tmp_path / "run").read_text()
