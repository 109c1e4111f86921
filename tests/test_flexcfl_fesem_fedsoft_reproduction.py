"""FlexCFL's, FeSEM's and FedSoft's recorded claims at the -small scale on the real MNIST
(docs/reproductions/flexcfl.md, fesem.md, fedsoft.md; seed 0).

Long: skipped by `make test`, run by `make reproduce-tests`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterfed import config as cfg
from clusterfed.experiments.compare import compare

pytestmark = [pytest.mark.reproduction, pytest.mark.shared_data]

OVERRIDES = ["run.progress=false", "run.threads=1"]


def summaries(preset: str, names: list[str], shared_data: Path, out: Path) -> dict:
    config = cfg.resolve(preset, OVERRIDES)
    return compare(config, out, names, data_dir=str(shared_data))["summaries"]


def test_flexcfl_small_keeps_three_groups_and_beats_fedavg_and_fesem(shared_data: Path,
                                                                    tmp_path: Path):
    """flexcfl-mnist-small (FedProx's rule, digits u and u + 1 mod 10), seed 0: FlexCFL's group
    cold start fills all m = 3 groups and they stay apart (3 clusters at the end), and the
    groups serve the clients >= 8 points better than FedAvg and FeSEM (the abstract's gain
    over FeSEM; measured: 87.81 against FedAvg 74.83 and FeSEM 73.42,
    docs/reproductions/flexcfl.md "Why FlexCFL is below FedAvg here")."""
    runs = summaries("flexcfl-mnist-small", ["fedavg", "fesem", "flexcfl"], shared_data,
                     tmp_path)
    flexcfl = runs["flexcfl"]
    assert flexcfl["clustering"]["n_clusters"] == 3
    for baseline in ("fedavg", "fesem"):
        assert flexcfl["final"]["mean_accuracy"] >= runs[baseline]["final"]["mean_accuracy"] + 0.08


def test_fedsoft_small_finds_both_sources_and_beats_one_model(shared_data: Path,
                                                              tmp_path: Path):
    """fedsoft-rotmnist-small, seed 0 (MNIST and MNIST rotated 90, each client one source):
    every client's largest importance weight is on its own source (ARI 1), and the centres
    serve the clients >= 8 points better than FedAvg's one model (measured: 76.56 against
    64.45; docs/reproductions/fedsoft.md)."""
    runs = summaries("fedsoft-rotmnist-small", ["fedavg", "fedsoft"], shared_data, tmp_path)
    fedsoft, fedavg = runs["fedsoft"], runs["fedavg"]
    assert fedsoft["clustering"]["ari"] == pytest.approx(1.0)
    assert fedsoft["final"]["cluster_mean_accuracy"] >= \
        fedavg["final"]["cluster_mean_accuracy"] + 0.08


def test_fedsoft_small_mixtures_recovers_every_clients_shares(shared_data: Path,
                                                              tmp_path: Path):
    """fedsoft-mixture-mnist-small, seed 0 (client i of 20 holds (i + 0.5)/20 unrotated MNIST,
    the rest rotated 90): FedSoft's importance weights are within 0.08 of every client's true
    shares on average (measured 0.0375; a perfect hard clustering scores 0.25, one model 0.5),
    and its centres serve the clients better than FedAvg's one model (66.67 against 65.47;
    docs/reproductions/fedsoft.md)."""
    runs = summaries("fedsoft-mixture-mnist-small", ["fedavg", "fedsoft"], shared_data,
                     tmp_path)
    fedsoft, fedavg = runs["fedsoft"], runs["fedavg"]
    assert fedsoft["clustering"]["shares_error"] <= 0.08
    assert fedavg["clustering"]["shares_error"] == pytest.approx(0.5)
    assert fedsoft["final"]["cluster_mean_accuracy"] > fedavg["final"]["cluster_mean_accuracy"]


def test_fesem_small_random_centres_collapse_to_one(shared_data: Path, tmp_path: Path):
    """fesem-mnist-small, seed 0: from K = 3 random centres (the paper's and the FlexCFL
    authors' start) every client's local model is nearest the same centre, so FeSEM ends with
    one cluster and scores as FedAvg does, within 2 points (measured on FedProx's rule: 73.42
    against 74.83; docs/reproductions/fesem.md)."""
    runs = summaries("fesem-mnist-small", ["fedavg", "fesem"], shared_data, tmp_path)
    fesem, fedavg = runs["fesem"], runs["fedavg"]
    assert fesem["clustering"]["n_clusters"] == 1
    assert abs(fesem["final"]["mean_accuracy"] - fedavg["final"]["mean_accuracy"]) <= 0.02


def test_fesem_small_default_finds_the_ten_digit_pairs(shared_data: Path, tmp_path: Path):
    """fesem-mnist-small, seed 0: our default (K from one round of local models, judged on
    squared L2) finds FedProx's 10 digit pairs exactly and serves them far above FedAvg
    (measured 98.5 against 74.8; docs/reproductions/fesem.md)."""
    runs = summaries("fesem-mnist-small", ["fedavg", "fesem-auto"], shared_data, tmp_path)
    auto, fedavg = runs["fesem-auto"], runs["fedavg"]
    assert auto["clustering"]["n_clusters"] == 10 and auto["clustering"]["ari"] == 1.0
    assert auto["final"]["mean_accuracy"] >= fedavg["final"]["mean_accuracy"] + 0.15


def test_fedsoft_small_from_the_centres_trains_slower_than_from_the_personal_models(
        shared_data: Path, tmp_path: Path):
    """fedsoft-rotmnist-small, seed 0: with each local problem started from the u-weighted
    centre mean (`local_start: anchor`) instead of the client's personal model, the centres
    serve the clients >= 10 points worse after 20 rounds (measured: 59.05 against 76.56; at
    the paper's scale the other way round, 91.01 against 87.53, docs/reproductions/fedsoft.md
    "Personal models restarted from the centres"), with the same split (ARI 1)."""
    preset = cfg.resolve("fedsoft-rotmnist-small", OVERRIDES)
    fedsoft = {"name": "fedsoft", "k": 2, "selection_size": None}
    config = cfg.merge(preset, {"compare": {"algorithms": [
        fedsoft, {**fedsoft, "local_start": "anchor", "label": "anchor"}]}})
    runs = compare(config, tmp_path, None, data_dir=str(shared_data))["summaries"]
    personal, anchor = runs["fedsoft"], runs["anchor"]
    assert anchor["clustering"]["ari"] == pytest.approx(1.0)
    assert personal["final"]["cluster_mean_accuracy"] >= \
        anchor["final"]["cluster_mean_accuracy"] + 0.10
