"""FL+HC's done-when claim on real MNIST (docs/reproductions/flhc.md); long, so marked."""

from __future__ import annotations

import pytest

from clusterfed import config as cfg
from clusterfed.experiments.compare import compare

pytestmark = [pytest.mark.shared_data, pytest.mark.reproduction]


def test_flhc_recovers_the_label_swap_groups_and_beats_fedavg_by_10_points(shared_data,
                                                                            tmp_path):
    """flhc-mnist-labelswap-small: 4 groups x 25 clients, C = 0.2, n = 10, 50 rounds.

    FL+HC finds the 4 groups (ARI >= 0.9) and its mean client accuracy at round 50 exceeds
    FedAvg's by at least 10 points (FedAvg cannot serve two labellings of the same digits).
    """
    config = cfg.resolve("flhc-mnist-labelswap-small",
                         [f"data.root={shared_data}", "run.progress=false", "run.threads=1"])
    summaries = compare(config, tmp_path, ["fedavg", "flhc"])["summaries"]
    flhc, fedavg = summaries["flhc"], summaries["fedavg"]
    assert flhc["rounds"] == fedavg["rounds"] == 50
    assert flhc["clustering"]["ari"] >= 0.9, flhc["clustering"]
    gain = flhc["final"]["mean_accuracy"] - fedavg["final"]["mean_accuracy"]
    assert gain >= 0.10, (flhc["final"]["mean_accuracy"], fedavg["final"]["mean_accuracy"])
