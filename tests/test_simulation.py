"""The simulator: run folders, evaluation protocols, rejected results, progress of state."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from helpers import tiny_config

from clusterfed.algorithms import ClusterView
from clusterfed.data import build_federation, load_dataset
from clusterfed.sim.simulation import Simulation, run_config


def test_run_folder_files(tmp_path):
    summary = run_config(tiny_config("fedavg"), tmp_path)
    assert {"config.yaml", "metrics.jsonl", "events.jsonl", "summary.json",
            "checkpoint.npz"} <= {p.name for p in tmp_path.iterdir()}
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    for key in ("algorithm", "rounds", "seed", "wall_seconds"):
        assert key in summary
    assert 0.0 <= summary["final"]["mean_accuracy"] <= 1.0
    assert len(summary["final"]["per_client_accuracy"]) == 8
    c = summary["clustering"]
    assert c["true_assignment"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert c["assignment"] == [0] * 8 and c["n_clusters"] == 1
    assert c["ari"] == pytest.approx(0.0) and c["nmi"] == pytest.approx(0.0)
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in metrics] == [1, 2, 3, 4]
    assert all(m["sampled"] == 4 for m in metrics)  # participation 0.5 of 8 clients
    assert metrics[-1]["mean_accuracy"] == summary["final"]["mean_accuracy"]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[0] == {"round": 1, "type": "assignment", "assignment": [0] * 8}


def test_fedavg_learns_on_digits_iid():
    cfg = tiny_config("fedavg", scenario={"kind": "iid", "clients": 5, "clusters": 1},
                      train={"rounds": 10, "participation": 1.0, "lr": 0.05, "momentum": 0.9,
                             "batch_size": 10})
    first = Simulation(cfg)
    summary = first.run()
    assert summary["final"]["mean_accuracy"] > 0.85
    assert summary["clustering"]["ari"] == pytest.approx(1.0)  # one true, one found cluster


def test_evaluation_every_n_rounds_and_always_last(tmp_path):
    run_config(tiny_config("fedavg", train={"rounds": 5}, eval={"every": 2}), tmp_path)
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert ["mean_accuracy" in m for m in metrics] == [False, True, False, True, True]


def test_local_protocol_uses_each_clients_last_trained_model():
    cfg = tiny_config("fedavg", train={"rounds": 2, "participation": 0.5},
                      eval={"protocol": "local"})
    sim = Simulation(cfg)
    sim.run()
    trained = sim.own_models
    assert 0 < len(trained) <= 8
    view = sim.algorithm.clusters(sim.state)
    record = sim._evaluate(sim.state, view, 1)
    got = np.array([record["per_client_loss"], record["per_client_accuracy"]]).T
    for c in range(8):
        params = trained.get(c, view.models[0])
        np.testing.assert_allclose(got[c], sim.executor.evaluate(params, [c])[0], atol=1e-6)
    # The cluster protocol evaluates the global model instead: a different figure.
    cluster = np.array([sim.executor.evaluate(view.models[0], [c])[0] for c in range(8)])
    assert not np.allclose(cluster[list(trained), 1], got[list(trained), 1]) or \
        not np.allclose(cluster[list(trained), 0], got[list(trained), 0])


def test_non_finite_update_is_rejected_and_round_goes_on(tmp_path, caplog):
    dataset = load_dataset("digits")
    fed = build_federation(dataset, {"kind": "iid", "clients": 4}, seed=0)
    fed.clients[2].train_x[:] = np.nan  # client 2 now always returns NaN updates
    cfg = tiny_config("fedavg", scenario={"kind": "iid", "clients": 4, "clusters": 1},
                      train={"rounds": 2, "participation": 1.0})
    with caplog.at_level(logging.WARNING, logger="clusterfed"):
        summary = run_config(cfg, tmp_path, federation=fed)
    assert "rejected the train result of client 2" in caplog.text
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    rejected = [e for e in events if e["type"] == "rejected_result"]
    assert [(e["round"], e["client"]) for e in rejected] == [(1, 2), (2, 2)]
    assert np.isfinite(summary["final"]["mean_accuracy"])
    sim = Simulation(cfg, federation=fed)
    sim.run()
    assert np.isfinite(sim.state.model).all()


def test_cluster_view_counts_distinct_clusters():
    view = ClusterView(np.zeros((3, 2), np.float32), np.array([2, 0, 2, 2]))
    assert view.num_clusters == 2


def test_callback_can_stop_early(tmp_path):
    summary = run_config(tiny_config("fedavg", train={"rounds": 6}), tmp_path,
                         callbacks=[lambda r, rec: r == 2])
    assert summary["rounds"] == 2
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_validation_share_is_held_out_of_training():
    cfg = tiny_config("fedavg", eval={"protocol": "best_of_path", "validation_fraction": 0.25})
    sim = Simulation(cfg)
    for c, client in enumerate(sim.federation.clients):
        n = client.num_train
        held = int(round(0.25 * n))
        assert len(sim.executor.train[c][1]) == n - held == sim.setup.num_samples[c]
        x_val, _ = sim.executor.validation[c]
        np.testing.assert_array_equal(x_val.numpy(), client.train_x[n - held:])


def test_best_of_path_without_a_tree_is_the_cluster_protocol():
    base = {"validation_fraction": 0.25}
    best = Simulation(tiny_config("fedavg", eval={"protocol": "best_of_path", **base})).run()
    plain = Simulation(tiny_config("fedavg", eval={"protocol": "cluster", **base})).run()
    assert best["final"]["per_client_accuracy"] == plain["final"]["per_client_accuracy"]


def test_run_threads_setting_does_not_outlive_the_run():
    import torch
    before = torch.get_num_threads()
    Simulation(tiny_config("fedavg", train={"rounds": 1}, run={"threads": 1})).run()
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("protocol", ["cluster", "local"])
def test_eval_split_validation_scores_the_held_out_training_data(protocol):
    """eval.split=validation: every client's figure is its served model's accuracy on its
    held-out training data, counted here by hand from the model's logits."""
    import torch

    cfg = tiny_config("fedavg", train={"rounds": 2},
                      eval={"protocol": protocol, "split": "validation",
                            "validation_fraction": 0.25})
    sim = Simulation(cfg)
    summary = sim.run()
    view = sim.algorithm.clusters(sim.state)
    own = sim.own_models if protocol == "local" else {}
    for c, (x, y) in enumerate(sim.executor.validation):
        model = own.get(c, view.models[view.assignment[c]])
        with torch.no_grad():
            logits = sim.executor.model(torch.from_numpy(np.asarray(model)), x)
        expected = float((logits.argmax(dim=1) == y).double().mean())
        assert summary["final"]["per_client_accuracy"][c] == pytest.approx(expected, abs=1e-6)
    test = Simulation(tiny_config("fedavg", train={"rounds": 2},
                                  eval={"protocol": protocol,
                                        "validation_fraction": 0.25})).run()
    assert test["final"]["per_client_accuracy"] != summary["final"]["per_client_accuracy"]
