"""LCFL (Gu et al., 2024): its phases, the client-side rows against the central matrix, the
options, resume across the clustering round, the authors' evaluation protocol, the report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import comparable, tiny_config

from clusterfed.algorithms import RoundContext, build_algorithm
from clusterfed.algorithms.lcfl import loss_distance as ld
from clusterfed.algorithms.lcfl.algorithm import (
    LCFL,
    LCFLState,
    exchange_cost,
    logged_clients,
    sample_within_clusters,
)
from clusterfed.algorithms.options import ClusterCount
from clusterfed.client import ClientTask, TaskKind, TrainSpec
from clusterfed.client.work import evaluate, loss_data, run_task
from clusterfed.config import merge
from clusterfed.errors import ConfigError
from clusterfed.report.pages import write_report
from clusterfed.sim.protocols import sampled_local_mean
from clusterfed.sim.simulation import Simulation, resume_run, run_config
from clusterfed.tasks import ClientResult, LossSpec


def lcfl_config(rounds: int = 4, **options) -> dict:
    """Digits, 4 label-swap clusters of 2 clients; LCFL clusters in round `warmup_rounds`."""
    return merge(tiny_config("lcfl", train={"rounds": rounds, "participation": 0.5,
                                            "local_epochs": 1, "batch_size": 20, "lr": 0.05,
                                            "momentum": 0.5}),
                 {"algorithm": {"name": "lcfl", "k": 4, "warmup_rounds": 2, **options}})


def test_phases_warm_up_exchange_then_fedavg_per_cluster():
    sim = Simulation(lcfl_config())
    algo, state, n = sim.algorithm, sim.algorithm.init(sim.setup), sim.federation.num_clients
    sampled = np.array([1, 4, 6, 7])
    ctx = RoundContext(0, sampled, sim.spec)
    # Round 0: a FedAvg round of the sampled clients.
    tasks = algo.plan(state, ctx)
    assert [t.client for t in tasks] == sampled.tolist()
    assert all(t.kind is TaskKind.TRAIN for t in tasks)
    state = algo.update(state, ctx, sim.executor.run(tasks, 0)).state
    assert not state.clustered
    # Round 1 (the warm-up's last): every client trains from the global model ...
    ctx = RoundContext(1, sampled, sim.spec)
    tasks = algo.plan(state, ctx)
    assert [t.client for t in tasks] == list(range(n))
    upd = algo.update(state, ctx, sim.executor.run(tasks, 1))
    assert not upd.round_done and upd.state.warm_models.shape == (n, sim.model.size)
    # ... then every client scores every warm-up model on its training data: one row each.
    ctx = RoundContext(1, sampled, sim.spec, step=1)
    tasks = algo.plan(upd.state, ctx)
    assert [t.kind for t in tasks] == [TaskKind.LOSSES] * n
    assert all(t.params.shape == (n, sim.model.size) for t in tasks)
    upd = algo.update(upd.state, ctx, sim.executor.run(tasks, 1, step=1))
    state = upd.state
    assert upd.round_done and state.clustered and state.warm_models is None
    event = upd.events[0]
    assert event["type"] == "lcfl_clustering" and len(event["distance"]) == n
    # The clusters are k-medoids' on the d the clients' rows gave (k = 4 given).
    d = ld.assemble(np.array([ld.half_row(r.losses, r.client)
                              for r in sorted(sim.executor.run(tasks, 1, step=1),
                                              key=lambda r: r.client)]))
    np.testing.assert_allclose(event["distance"], d, atol=1e-6)
    four = LCFL(k_choice=ClusterCount(k=4)).cluster_labels(d)[0]
    assert state.assignment.tolist() == four.tolist()
    assert len(state.models) == 4
    assert upd.metrics["lcfl"]["model_evaluations"] == n * n
    # Round 2: sampled clients train their own cluster's model.
    tasks = algo.plan(state, RoundContext(2, sampled, sim.spec))
    for t in tasks:
        np.testing.assert_array_equal(t.params, state.models[state.assignment[t.client]])


def test_client_rows_assemble_to_the_centrally_computed_matrix():
    """Each client's LOSSES task (its own row, its own half of Eq. 2) gives the same d as
    L[i, j] = L_i(w_j) computed directly over all pairs. Sequential executor: its losses are
    `evaluate`'s to the bit (grouped ones sum in another order)."""
    sim = Simulation(merge(lcfl_config(), {"run": {"executor": "sequential"}}))
    n = sim.federation.num_clients
    rng = np.random.default_rng(0)
    start = sim.setup.initial_params
    warm = (start + 0.3 * rng.normal(size=(n, len(start)))).astype(np.float32)
    state = LCFLState(start[None], np.zeros(n, dtype=np.int64), sim.setup.num_samples,
                      warm_models=warm)
    algo: LCFL = sim.algorithm
    tasks = algo.plan(state, RoundContext(1, np.arange(n), sim.spec, step=1))
    rows = sim.executor.run(tasks, 1, step=1)
    assembled = algo._distance(state, rows)
    central = np.array([[evaluate(sim.model, torch.as_tensor(warm[j]), *sim.executor.train[i])[0]
                         for j in range(n)] for i in range(n)])
    np.testing.assert_allclose(assembled, ld.loss_distance(central), rtol=1e-6, atol=1e-7)


def test_loss_data_options():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 4, generator=gen), torch.randint(0, 3, (30,), generator=gen)
    tx, ty = torch.randn(5, 4, generator=gen), torch.randint(0, 3, (5,), generator=gen)
    both = loss_data((x, y), (tx, ty), LossSpec("train+test"), gen)
    assert torch.equal(both[0], torch.cat([x, tx])) and torch.equal(both[1], torch.cat([y, ty]))
    sub = loss_data((x, y), (tx, ty), LossSpec(max_samples=7), torch.Generator().manual_seed(3))
    again = loss_data((x, y), (tx, ty), LossSpec(max_samples=7),
                      torch.Generator().manual_seed(3))
    assert len(sub[1]) == 7 and torch.equal(sub[0], again[0])
    # One subsample per task: every model is scored on the same rows.
    model = torch.nn.Linear(4, 3)
    from clusterfed.models import FlatModel
    flat = FlatModel(model)
    w = flat.initial_vector()
    stacked = torch.stack([w, w]).numpy()
    result = run_task(flat, ClientTask(0, TaskKind.LOSSES, stacked, loss=LossSpec(max_samples=7)),
                      (x, y), (tx, ty), torch.Generator().manual_seed(3))
    assert result.losses[0] == result.losses[1]
    assert result.losses[0] == pytest.approx(evaluate(flat, w, *sub)[0])
    assert result.meta["seconds"] >= 0
    with pytest.raises(ConfigError):
        LossSpec("test")


def test_diffnorm_clusters_without_an_exchange_step_and_gradcos_asks_for_gradients():
    sim = Simulation(lcfl_config(metric="diffnorm"))
    algo, state, n = sim.algorithm, sim.algorithm.init(sim.setup), sim.federation.num_clients
    ctx = RoundContext(1, np.arange(n), sim.spec)
    upd = algo.update(state, ctx, sim.executor.run(algo.plan(state, ctx), 1))
    assert upd.round_done and upd.state.clustered
    assert upd.metrics["lcfl"]["bytes_down_per_client"] == 0
    grad = Simulation(lcfl_config(metric="gradcos"))
    algo, state = grad.algorithm, grad.algorithm.init(grad.setup)
    upd = algo.update(state, ctx, grad.executor.run(algo.plan(state, ctx), 1))
    tasks = algo.plan(upd.state, RoundContext(1, np.arange(n), sim.spec, step=1))
    assert [t.kind for t in tasks] == [TaskKind.GRADIENT] * n
    np.testing.assert_array_equal(tasks[0].params, upd.state.models[0])   # A19: common point
    # Sattler-style: the cosine of the warm-up's last updates, no extra step.
    upd = Simulation(lcfl_config(metric="gradcos", gradcos_from="update")).algorithm.update(
        state, ctx, grad.executor.run(algo.plan(state, ctx), 1))
    assert upd.round_done and upd.state.clustered


def test_eq6_and_the_no_split_rule():
    sim = Simulation(lcfl_config(metric="loss_eq6"))
    algo, state, n = sim.algorithm, sim.algorithm.init(sim.setup), sim.federation.num_clients
    ctx = RoundContext(1, np.arange(n), sim.spec)
    upd = algo.update(state, ctx, sim.executor.run(algo.plan(state, ctx), 1))
    step = RoundContext(1, np.arange(n), sim.spec, step=1)
    results = sim.executor.run(algo.plan(upd.state, step), 1, step=1)
    lmat = np.stack([r.losses for r in results])
    d = algo._distance(upd.state, results)
    np.testing.assert_allclose(d, ld.eq6_distance(lmat))
    labels, _ = LCFL(k_choice=ClusterCount(k=3), min_distance=float(d.max()) + 1).cluster_labels(d)
    assert (labels == 0).all()


def test_local_warm_up_trains_every_client_alone_for_t_epochs():
    sim = Simulation(lcfl_config(warmup="local", warmup_epochs=3))
    algo, state, n = sim.algorithm, sim.algorithm.init(sim.setup), sim.federation.num_clients
    tasks = algo.plan(state, RoundContext(0, np.array([2]), sim.spec))
    assert [t.client for t in tasks] == list(range(n))
    assert all(t.train.epochs == 3 for t in tasks)
    np.testing.assert_array_equal(tasks[0].params, sim.setup.initial_params)
    upd = algo.update(state, RoundContext(0, np.array([2]), sim.spec),
                      sim.executor.run(tasks, 0))
    # No communication in Algorithm 1's warm-up: the server's model is still w0.
    np.testing.assert_array_equal(upd.state.models[0], sim.setup.initial_params)
    full = LCFL(warmup="local", warmup_epochs=1, warmup_full_batch=True)
    assert full._warmup_spec(sim.spec).num_steps(50) == 1


@pytest.mark.parametrize("init", ["members", "medoid"])
def test_cluster_initialisation_options(init):
    n, d = 6, 3
    warm = np.arange(n * d, dtype=np.float32).reshape(n, d)
    state = LCFLState(np.zeros((1, d), np.float32), np.zeros(n, dtype=np.int64),
                      np.array([1, 3, 1, 1, 1, 1]), warm_models=warm)
    algo = LCFL(k_choice=ClusterCount(k=2), metric="diffnorm", cluster_init=init)
    upd = algo._cluster(state, [])
    labels = upd.state.assignment
    for c in range(2):
        members = np.flatnonzero(labels == c)
        if init == "members":
            expected = np.average(warm[members], axis=0, weights=state.num_samples[members])
        else:
            expected = warm[upd.state.medoids[c]]
            assert upd.state.medoids[c] in members
        np.testing.assert_allclose(upd.state.models[c], expected, rtol=1e-6)


def test_automatic_k_by_silhouette_and_the_one_cluster_rule():
    rng = np.random.default_rng(0)
    truth = np.repeat([0, 1, 2], 5)
    d = np.where(truth[:, None] == truth[None], rng.uniform(0, 0.1, (15, 15)), 1.0)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0)
    labels, info = LCFL().cluster_labels(d)
    assert len(set(labels.tolist())) == 3 and info["silhouette"] > 0.8
    iid = rng.uniform(0.9, 1.0, (15, 15))
    iid = (iid + iid.T) / 2
    np.fill_diagonal(iid, 0)
    one, _ = LCFL(k_choice=ClusterCount(min_silhouette=0.5)).cluster_labels(iid)
    assert (one == 0).all()


def test_clustered_rounds_sample_within_each_cluster():
    # Spec 6.9: max(1, round(rho |C|)) of each cluster; clusters of 10, 3 and 1 at rho 0.3
    # give 3, 1 (round(0.9)) and 1 (at least one) members.
    assignment = np.repeat([0, 1, 2], [10, 3, 1])
    rng = np.random.default_rng(0)
    for _ in range(20):
        chosen = sample_within_clusters(assignment, 0.3, rng)
        assert np.bincount(assignment[chosen], minlength=3).tolist() == [3, 1, 1]
        assert len(set(chosen.tolist())) == len(chosen) and (np.diff(chosen) > 0).all()
    seen = {c for _ in range(50) for c in sample_within_clusters(assignment, 0.3, rng)}
    assert seen == set(range(14))     # uniform: every member is drawn sometimes
    assert sample_within_clusters(assignment, 1.0, rng).tolist() == list(range(14))
    # In the algorithm: rho is the round's sample size over all clients; a global sample of
    # 4 clients out of 8 that all sit in cluster 0 still trains every cluster.
    algo = LCFL(k_choice=ClusterCount(k=2))
    state = LCFLState(models=np.zeros((2, 3), np.float32), assignment=np.repeat([0, 1], 4),
                      num_samples=np.full(8, 10), clustered=True, seed=3)
    ctx = RoundContext(5, np.array([0, 1, 2, 3]), TrainSpec(lr=0.1, batch_size=10))
    planned = [t.client for t in algo.plan(state, ctx)]
    assert np.bincount(state.assignment[planned]).tolist() == [2, 2]
    assert planned == [t.client for t in algo.plan(state, ctx)]     # seeded by (seed, round)
    every = LCFL(k_choice=ClusterCount(k=2), cluster_sampling="global")
    assert [t.client for t in every.plan(state, ctx)] == [0, 1, 2, 3]


def test_exchange_cost_counts_the_all_pairs_exchange():
    assert exchange_cost("loss", "federated", 3, 10) == {
        "model_evaluations": 9, "bytes_down_per_client": 80, "bytes_up_per_client": 8}
    assert exchange_cost("loss", "local", 3, 10)["bytes_up_per_client"] == 48
    assert exchange_cost("gradcos", "federated", 3, 10)["bytes_up_per_client"] == 40
    assert exchange_cost("gradcos", "federated", 3, 10, "update")["bytes_up_per_client"] == 0
    assert exchange_cost("loss_eq6", "federated", 3, 10)["bytes_up_per_client"] == 12
    assert logged_clients(10, 20).tolist() == list(range(10))
    assert logged_clients(1200, 100).tolist()[:3] == [0, 12, 24]


@pytest.mark.parametrize("options", [{"warmup": "later"}, {"k": 0}, {"warmup_rounds": 0},
                                     {"metric": "kl"}, {"clustering": "kmeans"},
                                     {"warmup": "local", "warmup_steps": 5},
                                     {"clustering": "hierarchical", "k": 2, "threshold": 1.0}])
def test_bad_options_raise(options):
    with pytest.raises(ConfigError):
        build_algorithm({"name": "lcfl", **options})


def test_resume_across_the_clustering_round(tmp_path):
    cfg = merge(lcfl_config(rounds=3), {"run": {"checkpoint_every": 1}, "eval": {"every": 2}})
    whole = run_config(cfg, tmp_path / "whole")

    def stop_after(completed, record):
        if completed == 2:   # the clustering round, stopped before its checkpoint is written
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        run_config(cfg, tmp_path / "broken", callbacks=[stop_after])
    resumed = resume_run(tmp_path / "broken")   # from round 1: the clustering round reruns
    assert comparable(resumed) == comparable(whole)
    assert (tmp_path / "broken" / "metrics.jsonl").read_text() == \
        (tmp_path / "whole" / "metrics.jsonl").read_text()


def test_sampled_local_accuracy_is_the_authors_figure():
    # Sampled clients 0, 2 and 3 answered with these accuracies; weights are test sizes.
    got = sampled_local_mean({0: 0.2, 2: 0.6, 3: 0.5}, np.array([10, 99, 30, 60]))
    assert got == pytest.approx((0.2 * 10 + 0.6 * 30 + 0.5 * 60) / 100)
    # A sampled client that never answered is left out of the weights, not counted as 0.
    assert sampled_local_mean({0: 0.2, 3: 0.5}, np.array([10, 99, 30, 60])) == \
        pytest.approx((0.2 * 10 + 0.5 * 60) / 70)


def test_sampled_local_protocol_records_both_figures(tmp_path):
    cfg = merge(lcfl_config(rounds=3), {"eval": {"protocol": "sampled_local", "every": 2}})
    summary = run_config(cfg, tmp_path / "run")
    records = [json.loads(line) for line in
               (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "mean_accuracy" in r]
    assert [r["round"] for r in evaluated] == [2, 3]
    # The authors' figure is the headline; the 'local' protocol's mean is kept beside it.
    for r in evaluated:
        assert r["local_mean_accuracy"] == pytest.approx(np.mean(r["per_client_accuracy"]),
                                                         abs=1e-6)
    assert summary["final"]["mean_accuracy"] == evaluated[-1]["mean_accuracy"]


def test_report_has_the_lcfl_section(tmp_path):
    cfg = merge(lcfl_config(rounds=2), {"run": {"checkpoint_every": 0}})
    run_config(cfg, tmp_path)
    text = write_report(tmp_path).read_text()
    assert "## LCFL" in text
    for image in ("lcfl_distance.png", "lcfl_accuracy.png"):
        assert (tmp_path / image).stat().st_size > 0


def test_toy_result_meta_seconds_stay_out_of_state():
    result = ClientResult(0, TaskKind.LOSSES, 3, losses=np.zeros(2), meta={"seconds": 1.5})
    n = 2
    state = LCFLState(np.zeros((1, 4), np.float32), np.zeros(n, dtype=np.int64), np.ones(n),
                      warm_models=np.zeros((n, 4), np.float32))
    upd = LCFL(k_choice=ClusterCount(k=1))._cluster(
        state, [result, ClientResult(1, TaskKind.LOSSES, 3, losses=np.zeros(2))])
    assert upd.events[0]["client_seconds_total"] == 1.5
    assert "seconds" not in json.dumps(upd.metrics)
