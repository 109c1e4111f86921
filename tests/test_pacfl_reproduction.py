"""PACFL's claims at the -small scale on the real Fashion-MNIST (docs/reproductions/pacfl.md).

Long: skipped by `make test`, run by `make reproduce-tests`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clusterfed import config as cfg
from clusterfed.algorithms.newcomers import newcomer_ids
from clusterfed.experiments.compare import compare
from clusterfed.sim.simulation import run_config

pytestmark = [pytest.mark.reproduction, pytest.mark.shared_data]


def test_label_skew_20_pacfl_cluster_models_beat_the_global_model(shared_data: Path,
                                                                   tmp_path: Path):
    """Table 1 / Fig. 2, FMNIST, protocol against protocol: PACFL's cluster models at the
    authors' beta 3.5 serve their clients better than FedAvg's global model serves them, by
    >= 5 points after the -small budget (measured: 62.72 against 51.20; docs/reproductions/
    pacfl.md). Comparing PACFL's own models with FedAvg's global model, as the paper's table
    does, would pass for FedAvg itself (its own models score 89.76): so the test also checks
    that, scored as own models, FedAvg is no more than a point below PACFL, as at the paper's scale
    (97.15 against 97.27 over 3 seeds)."""
    config = cfg.resolve("pacfl-labelskew20-fmnist-small", [
        "run.progress=false", "run.threads=1", "algorithm.n_clusters=null", "algorithm.beta=3.5"])
    result = compare(config, tmp_path, ["fedavg", "pacfl"], data_dir=str(shared_data))
    pacfl = result["summaries"]["pacfl"]
    fedavg = result["summaries"]["fedavg"]["final"]
    assert pacfl["clustering"]["n_clusters"] > 2
    assert pacfl["final"]["cluster_mean_accuracy"] >= fedavg["cluster_mean_accuracy"] + 0.05
    assert fedavg["mean_accuracy"] >= pacfl["final"]["mean_accuracy"] - 0.01


def test_label_skew_30_gap_is_own_models_against_the_global_model(shared_data: Path,
                                                                   tmp_path: Path):
    """Table 6 (Table 1's 30 % column), FMNIST: scored the same way, FedAvg's own models after
    local training are level with PACFL's (within 1.5 points), and PACFL's own models are 10
    or more points above FedAvg's global model, the paper's protocol for FedAvg: its gap
    (95.46 against 80.70) is one protocol against the other. Measured at the -small scale,
    seeds 0-2: own 83.80 / 86.19 / 83.22 (FedAvg) against 84.58 / 86.21 / 83.38 (PACFL),
    FedAvg's global model 63.08 / 63.30 / 62.21; at the paper's scale, seed 0: 95.33 against
    95.30, global 84.53 (docs/reproductions/pacfl.md, "Table 6")."""
    config = cfg.resolve("pacfl-labelskew30-fmnist-small", ["run.progress=false", "run.threads=1"])
    result = compare(config, tmp_path, ["fedavg", "pacfl"], data_dir=str(shared_data))
    pacfl = result["summaries"]["pacfl"]["final"]
    fedavg = result["summaries"]["fedavg"]["final"]
    assert fedavg["mean_accuracy"] >= pacfl["mean_accuracy"] - 0.015
    assert pacfl["mean_accuracy"] >= fedavg["cluster_mean_accuracy"] + 0.10


def test_newcomers_get_a_model_as_good_as_the_old_clients(shared_data: Path, tmp_path: Path):
    """Table 3, FMNIST: the 20 newcomers, clustered by PME and fine-tuned once, reach the
    accuracy the 80 federated clients have (within 5 points; measured: 88.22 against 84.03)."""
    config = cfg.resolve("pacfl-newcomers-small", ["run.progress=false", "run.threads=1"])
    summary = run_config(config, tmp_path, data_dir=str(shared_data))
    acc = np.asarray(summary["final"]["per_client_accuracy"])
    newcomers = newcomer_ids(config)
    old = np.setdiff1d(np.arange(len(acc)), newcomers)
    assert acc[newcomers].mean() >= acc[old].mean() - 0.05


def test_table_3_gap_is_fine_tuning_against_a_model_as_received(shared_data: Path,
                                                                 tmp_path: Path):
    """Table 3, FMNIST: scored the same way (each newcomer's model after its one round of
    local training), FedAvg's newcomers are within 2 points of PACFL's; the paper's 19-point
    gap sets PACFL's fine-tuned models against FedAvg's global model as received, which the
    newcomers score 20 points or more below (measured at this scale: PACFL 88.01, FedAvg 88.60
    fine-tuned and 47.67 as received; at the paper's scale, seed 0: 96.14, 95.17, 70.77)."""
    config = cfg.resolve("pacfl-newcomers-small", ["run.progress=false", "run.threads=1"])
    result = compare(config, tmp_path, ["pacfl", "fedavg"], data_dir=str(shared_data))
    pacfl = result["summaries"]["pacfl"]["final"]["newcomers"]
    fedavg = result["summaries"]["fedavg"]["final"]["newcomers"]
    assert fedavg["mean_accuracy"] >= pacfl["mean_accuracy"] - 0.02
    assert fedavg["cluster_mean_accuracy"] <= pacfl["mean_accuracy"] - 0.20


def test_table_3_solo_newcomers_trained_as_the_authors_solo_beat_one_round(shared_data: Path,
                                                                           tmp_path: Path):
    """Table 3, FMNIST, SOLO: newcomers trained 5 rounds from a fresh model (the authors'
    unseen_clients/solo.sh, the preset's `newcomers: {finetune_rounds: 5}`) score >= 3 points
    above one round (measured at this scale: 84.80 against 57.66; at the paper's scale, seeds
    0-2: 93.99 against 88.01, the paper 95.13; docs/reproductions/pacfl.md)."""
    config = cfg.resolve("pacfl-newcomers-small", ["run.progress=false", "run.threads=1"])
    solo = {"name": "local", "clients": "sampled"}
    config = cfg.merge(config, {"compare": {"algorithms": [
        {**solo, "label": "one"}, {**solo, "label": "five", "newcomers": {"finetune_rounds": 5}}]}})
    runs = compare(config, tmp_path, None, data_dir=str(shared_data))["summaries"]
    one, five = (runs[k]["final"]["newcomers"]["mean_accuracy"] for k in ("one", "five"))
    assert five >= one + 0.03, (one, five)


def test_label_skew_20_cfl_as_the_pacfl_authors_ran_it_splits_where_a9_does_not(
        shared_data: Path, tmp_path: Path):
    """Table 1's CFL row at the paper's scale, cut to 45 rounds: the PACFL authors' copy
    (`cfl_authors`: eps 0.4 / 1.6 from round 21, every member's latest update) splits the 20 %
    label-skew federation (seed 0: at round 41, 62 / 38 clients), while CFL testing only whole
    rounds (`split_on: fresh`, spec A9) never does at 10 % participation."""
    config = cfg.resolve("pacfl-labelskew20-fmnist", [
        "train.rounds=45", "eval.every=45", "run.progress=false", "run.threads=1"])
    result = compare(config, tmp_path, ["cfl", "cfl_authors"], data_dir=str(shared_data))
    fresh, authors = (result["summaries"][k]["clustering"] for k in ("cfl", "cfl_authors"))
    assert fresh["n_clusters"] == 1
    assert authors["n_clusters"] == 2
    assert min(np.bincount(authors["assignment"])) >= 10
