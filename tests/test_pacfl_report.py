"""PACFL's report section and the paper's efficiency measures (Tables 4, 8, 9)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_config

from clusterfed import config as cfg
from clusterfed.algorithms.pacfl import report as pacfl_plots
from clusterfed.experiments.compare import compare
from clusterfed.report.pages import write_report
from clusterfed.sim.simulation import run_config


@pytest.mark.parametrize("rounds, cost", [(19, 7.53), (26, 10.31), (200, 79.36)])
def test_paper_cost_reproduces_table_8_cells(rounds, cost):
    # LeNet-5 on 3x32x32 (62,006 parameters), 10 % per round, one model down and one up.
    assert pacfl_plots.paper_cost_mb(rounds, 0.1, 2, 62_006) == cost


def test_rounds_to_target_is_the_first_evaluated_round_reaching_it():
    metrics = [{"round": 1}, {"round": 2, "mean_accuracy": 0.6}, {"round": 3},
               {"round": 4, "mean_accuracy": 0.81}, {"round": 5, "mean_accuracy": 0.7}]
    assert pacfl_plots.rounds_to_target(metrics, 0.8) == 4
    assert pacfl_plots.rounds_to_target(metrics, 0.5) == 2
    assert pacfl_plots.rounds_to_target(metrics, 0.9) is None


def test_cut_height_lies_between_the_kept_and_the_refused_merges():
    event = {"tree": [[0, 1, 1.0, 2], [2, 3, 2.0, 2], [4, 5, 9.0, 4]], "labels": [0, 0, 1, 1],
             "beta": 100.0}
    assert pacfl_plots.cut_height({**event, "n_clusters": 2}) == pytest.approx(5.5)
    assert pacfl_plots.cut_height({**event, "n_clusters": None, "beta": 3.0}) == 3.0
    # Records without the key: beta where it explains the labels, else between the merges.
    assert pacfl_plots.cut_height(event) == pytest.approx(5.5)
    assert pacfl_plots.cut_height({**event, "beta": 3.0}) == 3.0


def test_run_and_comparison_reports_have_the_pacfl_section(tmp_path: Path):
    base = cfg.merge(tiny_config("pacfl", scenario={"kind": "label_groups", "clients": 8,
                                                    "clusters": 2},
                                 train={"rounds": 2}, eval={"protocol": "local",
                                                            "also_cluster": True}),
                     {"algorithm": {"name": "pacfl", "beta": 20.0, "newcomers": [7],
                                    "join_round": 1}})
    run_config(base, tmp_path / "run")
    text = write_report(tmp_path / "run").read_text()
    assert "## PACFL" in text and "smallest across" in text and "newcomers (1)" in text
    for image in pacfl_plots.IMAGES.values():
        assert (tmp_path / "run" / image).stat().st_size > 0
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    kinds = [e["type"] for e in events if e["type"].startswith("pacfl")]
    assert kinds == ["pacfl_clustering", "pacfl_newcomers"]
    arrival = next(e for e in events if e["type"] == "pacfl_newcomers")
    assert np.asarray(arrival["proximity"]).shape == (8, 8) and arrival["newcomers"] == [7]
    compare(cfg.merge(base, {"algorithm": {"name": "pacfl", "beta": 20.0}}),
            tmp_path / "cmp", ["fedavg", "pacfl"])
    text = write_report(tmp_path / "cmp").read_text()
    assert "Rounds to target" in text and "| fedavg |" in text and "| pacfl |" in text
