"""CFL Fig. 8's structure on Fashion-MNIST label permutations, checked at the -small scale.

Fig. 8 (CIFAR-10, absent here): FL stagnates while CFL splits the clients by their label
permutation and each cluster then learns. The record (docs/reproductions/cfl.md) is
`cfl-fmnist-permutation-small`, seed 0: FedAvg 0.36, CFL 0.77 with the 4 permutation
clusters exactly (ARI 1.0); the full-data preset is the same federation at 10x the data.
"""

from __future__ import annotations

import pytest

from clusterfed import config as cfg
from clusterfed.experiments.compare import compare

pytestmark = [pytest.mark.shared_data, pytest.mark.reproduction]


def test_cfl_splits_the_permutations_where_fedavg_stagnates(shared_data, tmp_path):
    config = cfg.resolve("cfl-fmnist-permutation-small",
                         [f"data.root={shared_data}", "run.progress=false", "run.threads=1",
                          "seed=0"])
    summaries = compare(config, tmp_path, ["fedavg", "cfl"])["summaries"]
    cfl, fedavg = summaries["cfl"], summaries["fedavg"]
    assert cfl["clustering"]["n_clusters"] == 4, cfl["clustering"]
    assert cfl["clustering"]["ari"] >= 0.99, cfl["clustering"]
    # One model cannot serve four labellings of the same images: FedAvg stays far below.
    assert fedavg["final"]["mean_accuracy"] < 0.5, fedavg["final"]["mean_accuracy"]
    gain = cfl["final"]["mean_accuracy"] - fedavg["final"]["mean_accuracy"]
    assert gain >= 0.25, (cfl["final"]["mean_accuracy"], fedavg["final"]["mean_accuracy"])
