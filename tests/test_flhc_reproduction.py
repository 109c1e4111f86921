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


def test_iid_clients_stay_together_after_ten_rounds_but_split_after_one(shared_data, tmp_path):
    """Section IV's iid text at the paper's model and tau (Ward, L2, tau = 3.0): one cluster
    for n = 10, spurious clusters for n = 1 (docs/reproductions/flhc.md: at 100 clients, seed
    0, highest merge 2.48 for n = 10; 16 clusters for n = 1). n = 10 is checked on 20 of the
    clients (highest merge 2.30); n = 1 on all 100, since Ward's merges grow with the clients
    and 20 of them stay below the cut (highest merge 2.99). About 10 core-minutes."""
    from clusterfed.sim.simulation import run_config

    def clusters(n: int, clients: int) -> int:
        config = cfg.resolve("flhc-mnist-iid", [
            f"data.root={shared_data}", "run.progress=false", "run.threads=1",
            f"scenario.clients={clients}", f"algorithm.rounds_before_clustering={n}",
            f"train.rounds={n + 1}", f"eval.every={n + 1}"])
        return run_config(config, tmp_path / f"n{n}")["clustering"]["n_clusters"]

    assert clusters(10, 20) == 1
    assert clusters(1, 100) > 1


def test_table_v_single_linkage_chains_where_cosine_and_ward_separate(shared_data, tmp_path):
    """Table V's pairings from one clustering round (flhc-mnist-labelswap-small, seed 0, 11
    rounds): some cut of every cosine tree and of L2 / Ward recovers the 4 groups exactly,
    while no cut of single linkage under L2 or L1 comes near them (at this scale best ARI 0.676
    and 0; at the paper's, seed 0: 0 and 0, docs/reproductions/flhc.md "Tables IV/V")."""
    from clusterfed.experiments import flhc_pairings as fp

    config = cfg.resolve("flhc-mnist-labelswap-small", [
        f"data.root={shared_data}", "run.progress=false", "run.threads=1", "train.rounds=11"])
    result = fp.run_pairings(config, tmp_path)
    best = {(c["metric"], c["linkage"]): c["ari"] for c in result["best_cuts"]}
    for linkage in ("average", "complete", "single"):
        assert best["cosine", linkage] == pytest.approx(1.0), best
    assert best["l2", "ward"] == pytest.approx(1.0), best
    assert best["l2", "single"] <= 0.7 and best["l1", "single"] <= 0.7, best
