"""PACFL the algorithm: one-shot clustering of signatures, FedAvg per cluster, newcomers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import comparable, tiny_config

from clusterfed import config as cfg
from clusterfed.algorithms import RoundContext, Setup, build_algorithm
from clusterfed.algorithms.pacfl import principal_angles as pa
from clusterfed.algorithms.pacfl.algorithm import UNASSIGNED
from clusterfed.client import ClientResult, TaskKind, TrainSpec, signature
from clusterfed.clustering.metrics import clustering_scores
from clusterfed.errors import ConfigError
from clusterfed.experiments.compare import labelled_sections, run_config_of
from clusterfed.sim.simulation import Simulation, run_config
from clusterfed.tasks import SignatureSpec

SPEC = TrainSpec(lr=0.1, batch_size=10)


def pacfl_config(options=None, **sections):
    return cfg.merge(tiny_config("pacfl", **sections), {"algorithm": {"name": "pacfl",
                                                                       **(options or {})}})


def groups_config(options=None, **sections):
    """Digits in 2 label groups (labels 0-4 and 5-9 in a seeded order), 8 clients."""
    return pacfl_config(options, scenario={"kind": "label_groups", "clients": 8, "clusters": 2},
                        **sections)


def signature_result(client: int, u: np.ndarray) -> ClientResult:
    return ClientResult(client, TaskKind.SIGNATURE, 10, signature=u.astype(np.float32),
                        signature_labels=np.full(u.shape[1], -1))


def train_result(client: int, update: np.ndarray, n: int) -> ClientResult:
    return ClientResult(client, TaskKind.TRAIN, n, update=update.astype(np.float32), loss=0.1)


def test_round_zero_asks_every_client_for_a_signature_and_trains_only_sampled_ones():
    sim = Simulation(groups_config({"newcomers": [7],
                                              "join_round": 2}))
    algo, state = sim.algorithm, sim.algorithm.init(sim.setup)
    sampled = np.array([1, 4, 7])
    tasks = algo.plan(state, RoundContext(0, sampled, sim.spec))
    signers = [t.client for t in tasks if t.kind is TaskKind.SIGNATURE]
    trainers = [t.client for t in tasks if t.kind is TaskKind.TRAIN]
    assert signers == [0, 1, 2, 3, 4, 5, 6]      # the newcomer arrives later
    assert trainers == [1, 4]                    # sampled, newcomer excluded
    assert all(np.array_equal(t.params, sim.setup.initial_params) for t in tasks
               if t.kind is TaskKind.TRAIN)
    results = sim.executor.run(tasks, 0)
    upd = algo.update(state, RoundContext(0, sampled, sim.spec), results)
    assert upd.round_done and upd.events[0]["type"] == "pacfl_clustering"
    later = algo.plan(upd.state, RoundContext(1, sampled, sim.spec))
    assert {t.kind for t in later} == {TaskKind.TRAIN}
    assert [t.client for t in later] == [1, 4]


def test_fedavg_inside_each_cluster_with_participants_weights():
    algo = build_algorithm({"name": "pacfl", "beta": 10.0, "signature": "whole"})
    d = 5
    state = algo.init(Setup(4, np.zeros(d, dtype=np.float32), np.full(4, 10), 0))
    e = np.eye(6)
    # Clients 0, 1 share a subspace; 2, 3 another one at 90 degrees.
    sigs = [signature_result(c, e[:, [0]] if c < 2 else e[:, [3]]) for c in range(4)]
    trained = [train_result(0, np.ones(d), 30), train_result(1, 3 * np.ones(d), 10)]
    upd = algo.update(state, RoundContext(0, np.array([0, 1]), SPEC), sigs + trained)
    state = upd.state
    assert state.assignment.tolist() == [0, 0, 1, 1]
    np.testing.assert_allclose(state.models[0], 1.5)   # (30 * 1 + 10 * 3) / 40
    np.testing.assert_array_equal(state.models[1], 0)  # no participant: theta_0 kept
    upd = algo.update(state, RoundContext(1, np.array([2]), SPEC),
                      [train_result(2, -2 * np.ones(d), 7)])
    np.testing.assert_allclose(upd.state.models[1], -2)  # one participant: its model
    np.testing.assert_allclose(upd.state.models[0], 1.5)
    assert upd.metrics["pacfl"]["up_floats"] == d


def test_one_cluster_is_fedavg_bit_for_bit():
    # beta above every angle gives Z = 1: the same sampler, seeds and model as FedAvg.
    pacfl = Simulation(pacfl_config({"beta": 1000.0}))
    fedavg = Simulation(tiny_config("fedavg"))
    a, b = pacfl.run(), fedavg.run()
    assert a["clustering"]["n_clusters"] == 1
    assert comparable(a)["final"] == comparable(b)["final"]
    np.testing.assert_array_equal(pacfl.state.models[0], fedavg.state.model)


def test_beta_zero_is_local_training_bit_for_bit():
    # Every client its own cluster: each trains from its own last model when sampled, as
    # SOLO restricted to the sampled clients does.
    pacfl = Simulation(pacfl_config({"beta": 0.0}))
    local = Simulation(cfg.merge(tiny_config("local"),
                                 {"algorithm": {"name": "local", "clients": "sampled"}}))
    a, b = pacfl.run(), local.run()
    assert a["clustering"]["n_clusters"] == 8
    assert comparable(a)["final"] == comparable(b)["final"]


def test_recovers_label_groups_and_logs_the_clustering(tmp_path: Path):
    cfg_ = groups_config({"beta": 20.0}, train={"rounds": 2})
    summary = run_config(cfg_, tmp_path)
    assert summary["clustering"]["ari"] == 1.0
    events = [e for e in (tmp_path / "events.jsonl").read_text().splitlines()
              if "pacfl_clustering" in e]
    assert len(events) == 1


def test_newcomers_join_their_group_and_old_clients_keep_their_clusters():
    cfg_ = groups_config({"beta": 20.0, "newcomers": [3, 7],
                                    "join_round": 2},
                         train={"rounds": 4, "participation": 1.0})
    sim = Simulation(cfg_)
    algo = sim.algorithm
    state = algo.init(sim.setup)
    everyone = np.arange(8)
    before = None
    for r in range(4):
        ctx = RoundContext(r, everyone, sim.spec)
        while True:
            tasks = algo.plan(state, ctx)
            if r < 2:
                assert not {3, 7} & {t.client for t in tasks}
            results = sim.executor.run(tasks, r, ctx.step)
            upd = algo.update(state, ctx, results)
            if r == 2 and ctx.step == 0:
                assert [t.client for t in tasks] == [3, 7]
                assert not upd.round_done and upd.events[0]["newcomers"] == [3, 7]
                before = state
            if r == 2 and ctx.step == 1:
                finetune = [t for t in tasks if t.meta.get("finetune")]
                assert [t.client for t in finetune] == [3, 7]
            state = upd.state
            if upd.round_done:
                break
            ctx = RoundContext(r, everyone, sim.spec, step=ctx.step + 1)
    assert before is not None
    old = [0, 1, 2, 4, 5, 6]
    assert before.assignment[[3, 7]].tolist() == [UNASSIGNED, UNASSIGNED]
    np.testing.assert_array_equal(state.assignment[old], before.assignment[old])
    true = sim.federation.true_clusters
    assert clustering_scores(true, state.assignment)["ari"] == 1.0
    # PME: the extended matrix is the whole matrix of all signatures in joining order.
    np.testing.assert_allclose(state.proximity, pa.proximity_matrix(state.signatures),
                               atol=1e-9)
    assert state.clustered.tolist() == [0, 1, 2, 4, 5, 6, 3, 7]


def test_finetuning_newcomers_do_not_change_the_cluster_model():
    algo = build_algorithm({"name": "pacfl", "beta": 10.0, "signature": "whole",
                            "newcomers": [2], "join_round": 1})
    state = algo.init(Setup(3, np.zeros(4, dtype=np.float32), np.full(3, 10), 0))
    e = np.eye(6)
    upd = algo.update(state, RoundContext(0, np.array([], dtype=np.int64), SPEC),
                      [signature_result(0, e[:, [0]]), signature_result(1, e[:, [3]])])
    upd = algo.update(upd.state, RoundContext(1, np.arange(3), SPEC),
                      [signature_result(2, e[:, [0]] + 0.01 * e[:, [1]])])
    state = upd.state
    assert state.assignment.tolist() == [0, 1, 0]
    tasks = algo.plan(state, RoundContext(1, np.arange(3), SPEC, step=1))
    assert [(t.client, dict(t.meta)) for t in tasks] == [
        (0, {"cluster": 0}), (1, {"cluster": 1}), (2, {"cluster": 0, "finetune": 1})]
    ft = ClientResult(2, TaskKind.TRAIN, 10, update=np.full(4, 9, np.float32), loss=0.1,
                      meta={"cluster": 0, "finetune": 1})
    upd = algo.update(state, RoundContext(1, np.arange(3), SPEC, step=1), [ft])
    np.testing.assert_array_equal(upd.state.models, state.models)


def test_a_dissimilar_newcomer_starts_a_new_cluster_from_theta0():
    algo = build_algorithm({"name": "pacfl", "beta": 10.0, "signature": "whole",
                            "newcomers": [2], "join_round": 1})
    state = algo.init(Setup(3, np.zeros(4, dtype=np.float32), np.full(3, 10), 0))
    e = np.eye(6)
    upd = algo.update(state, RoundContext(0, np.array([0]), SPEC),
                      [signature_result(0, e[:, [0]]), signature_result(1, e[:, [0]]),
                       train_result(0, np.ones(4), 10)])
    upd = algo.update(upd.state, RoundContext(1, np.arange(3), SPEC),
                      [signature_result(2, e[:, [5]])])
    assert upd.state.assignment.tolist() == [0, 0, 1]
    np.testing.assert_array_equal(upd.state.models[1], 0)


def in_plane(degrees: float) -> np.ndarray:
    """A unit signature column at `degrees` from e0 in the (e0, e1) plane of R^6."""
    t = np.radians(degrees)
    return (np.cos(t) * np.eye(6)[:, [0]] + np.sin(t) * np.eye(6)[:, [1]])


def admit(options: dict, newcomer: float | np.ndarray) -> list[int]:
    """Old clients at 0 and 9 degrees (one cluster at beta 10) and one at 90; a newcomer at
    `newcomer` degrees in their plane (or the given column)."""
    algo = build_algorithm({"name": "pacfl", "signature": "whole", "newcomers": [3],
                            "join_round": 1, **options})
    state = algo.init(Setup(4, np.zeros(4, dtype=np.float32), np.full(4, 10), 0))
    old = [signature_result(c, in_plane(a)) for c, a in ((0, 0.0), (1, 9.0), (2, 90.0))]
    upd = algo.update(state, RoundContext(0, np.array([], dtype=np.int64), SPEC), old)
    assert upd.state.assignment[:3].tolist() == [0, 0, 1]
    upd = algo.update(upd.state, RoundContext(1, np.arange(4), SPEC),
                      [signature_result(3, in_plane(newcomer) if np.isscalar(newcomer)
                                        else newcomer)])
    return upd.state.assignment.tolist()


def test_a_newcomer_joins_the_nearest_cluster_by_mean_angle_within_beta():
    # Spec #12: mean angle to {0, 1} is (16 + 7) / 2 = 11.5 > 10: a new cluster; at 14
    # degrees it is (14 + 5) / 2 = 9.5 <= 10: cluster 0.
    assert admit({"beta": 10.0}, 16.0) == [0, 0, 1, 2]
    assert admit({"beta": 10.0}, 14.0) == [0, 0, 1, 0]
    # Alg. 3's rerun merges the newcomer with client 1 at 7 degrees, so it joins cluster 0.
    assert admit({"beta": 10.0, "newcomer_rule": "rerun"}, 16.0) == [0, 0, 1, 0]
    # A cut by count: the threshold is halfway between the merges at 9 and 85.5 degrees
    # (weighted linkage of {0, 1} with 2: (90 + 81) / 2), 47.25.
    assert admit({"n_clusters": 2}, 16.0) == [0, 0, 1, 0]
    assert admit({"n_clusters": 2}, 60.0) == [0, 0, 1, 1]      # 30 from client 2
    assert admit({"n_clusters": 2}, np.eye(6)[:, [2]]) == [0, 0, 1, 2]   # 90 from all
    with pytest.raises(ConfigError, match="newcomer_rule: rerun"):
        build_algorithm({"name": "pacfl", "reassign_existing": True})


@pytest.mark.parametrize("options, message", [
    ({"linkage": "ward"}, "linkage"), ({"measure": "cosine"}, "measure"),
    ({"measure": "ordered_sum"}, "identical order"), ({"newcomers": [1]}, "join_round"),
    ({"p": 0}, "p must"), ({"beta": -1.0}, "beta")])
def test_bad_options_raise_clear_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        build_algorithm({"name": "pacfl", **options})


def test_eval_also_cluster_records_the_cluster_model_protocol():
    sim = Simulation(groups_config({"beta": 20.0},
                                   eval={"protocol": "local", "also_cluster": True},
                                   train={"rounds": 2}))
    final = sim.run()["final"]
    view = sim.algorithm.clusters(sim.state)
    for c in range(8):
        # Each client's own last trained model (or its cluster's if it never trained), and its
        # cluster's model, scored on its test data.
        own = sim.own_models.get(c, view.models[view.assignment[c]])
        assert final["per_client_accuracy"][c] == pytest.approx(
            sim.executor.evaluate(own, [c])[0, 1], abs=1e-6)
        assert final["cluster_per_client_accuracy"][c] == pytest.approx(
            sim.executor.evaluate(view.models[view.assignment[c]], [c])[0, 1], abs=1e-6)
    assert final["cluster_mean_accuracy"] == pytest.approx(
        np.mean(final["cluster_per_client_accuracy"]), abs=1e-6)


@pytest.mark.parametrize("algorithm, participation", [("local", 0.5), ("fedavg", 0.25)])
def test_also_cluster_scores_a_client_served_its_cluster_model_once(algorithm, participation,
                                                                    monkeypatch):
    """SOLO's own models are its clusters' models, and a client that never trained is served
    its cluster model: their cluster figures are their served ones, without a second pass."""
    config = groups_config(eval={"protocol": "local", "also_cluster": True},
                           train={"rounds": 1, "participation": participation})
    config["algorithm"] = {"name": algorithm}
    sim = Simulation(config)
    parts: list[str] = []
    run = sim.executor.run
    monkeypatch.setattr(sim.executor, "run", lambda tasks, *a: parts.extend(
        t.meta.get("part") for t in tasks if t.kind is TaskKind.EVALUATE) or run(tasks, *a))
    final = sim.run()["final"]
    view = sim.algorithm.clusters(sim.state)
    trained = {c for c in sim.own_models
               if not np.array_equal(sim.own_models[c], view.models[view.assignment[c]])}
    assert parts.count("served") == 8 and parts.count("cluster") == len(trained)
    assert len(trained) == (0 if algorithm == "local" else 2)
    for c in range(8):
        assert final["cluster_per_client_accuracy"][c] == pytest.approx(
            sim.executor.evaluate(view.models[view.assignment[c]], [c])[0, 1], abs=1e-6)


PACFL_PRESETS = [n for n in cfg.preset_names() if n.startswith("pacfl-")]


def test_the_paper_presets_exist_at_both_scales():
    datasets = ("fmnist", "cifar10", "cifar100", "svhn")
    wanted = {f"pacfl-labelskew{r}-{d}" for r in (20, 30) for d in datasets}
    wanted |= {"pacfl-dirichlet", "pacfl-mix4", "pacfl-newcomers"}
    wanted |= {f"{n}-small" for n in wanted}
    assert wanted <= set(PACFL_PRESETS)


@pytest.mark.parametrize("name", PACFL_PRESETS)
def test_every_pacfl_preset_resolves(name):
    config = cfg.resolve(name)
    build_algorithm(config["algorithm"])
    for _, section in labelled_sections(config, None):
        run = run_config_of(config, section)   # an entry's own eval / newcomers keys apart
        build_algorithm(run["algorithm"], run["newcomers"])
    text = cfg.preset_paths()[name].read_text()
    assert text.startswith("#") and "spec" in text
    # Per-FedAvg as the PACFL authors' code runs it: no test-time step, epochs of one pass,
    # one optimiser through the inner and the outer step.
    per_fedavg = [e for e in config["compare"]["algorithms"]
                  if isinstance(e, dict) and e["name"] == "per_fedavg"]
    assert [(e["personal_steps"], e["epoch"], e["momentum"]) for e in per_fedavg] == [
        (0, "pass", "shared")] * len(per_fedavg)


@pytest.mark.shared_data
def test_fmnist_label_groups_recovered_exactly_from_signatures_alone(shared_data: Path):
    """Done-when: 100 clients in 5 groups of two Fashion-MNIST labels -> ARI 1.0, no training.

    On seed 0 the largest angle inside a group is 4.1 degrees and the smallest across 7.5:
    beta 5 lies in the gap."""
    config = cfg.resolve("pacfl-labelskew20-fmnist", [
        "scenario.kind=label_groups", "scenario.clusters=5", "scenario.labels_per_group=2",
        "scenario.test=split", "scenario.test_samples_per_client=5",
        "algorithm.n_clusters=null", "algorithm.beta=5.0"])
    sim = Simulation(config, data_dir=str(shared_data))
    algo = sim.algorithm
    ctx = RoundContext(0, np.array([], dtype=np.int64), sim.spec)
    tasks = algo.plan(algo.init(sim.setup), ctx)
    assert len(tasks) == 100 and {t.kind for t in tasks} == {TaskKind.SIGNATURE}
    state = algo.update(algo.init(sim.setup), ctx, sim.executor.run(tasks, 0)).state
    assert clustering_scores(sim.federation.true_clusters, state.assignment)["ari"] == 1.0


def test_budget_allocation_is_the_codes_dirichlet_rule():
    # n = 100 over 4 classes: only class 0 (60 %) clears 1/4 + 0.05, so it weighs 60 against
    # the others' shares 0.25, 0.10, 0.05: 20 * 60 / 60.4 = 19.87 -> all 20 vectors.
    assert signature.budget_allocation(np.array([60, 25, 10, 5]), 20).tolist() == [20, 0, 0, 0]
    # Two dominant classes of 45 against one share 0.1: 9.99, 9.99, 0.02 -> 10, 10, 0.
    assert signature.budget_allocation(np.array([45, 45, 10]), 20).tolist() == [10, 10, 0]
    # No dominant class: shares of equal counts, 20 / 3 = 6.67 -> 7, 7, 6 by remainders.
    assert signature.budget_allocation(np.array([10, 10, 10]), 20).tolist() == [7, 7, 6]
    rng = np.random.default_rng(0)
    x = rng.random((100, 1, 4, 4))
    y = np.repeat([0, 1, 2, 3], [60, 25, 10, 5])
    u, labels = signature.client_signature(x, y, budget=20)
    assert u.shape == (16, 16) and set(labels.tolist()) == {0}   # rank 16: 16 of the 20
    with pytest.raises(ConfigError, match="budget"):
        build_algorithm({"name": "pacfl", "budget": 20, "signature": "whole"})


def test_signature_options_travel_as_a_typed_spec_and_the_client_uses_them():
    options = {"p": 2, "center": True, "mean": [0.1, ], "std": [0.3],
               "svd": "exact", "budget": 40}
    sim = Simulation(groups_config(options))
    state = sim.algorithm.init(sim.setup)
    tasks = [t for t in sim.algorithm.plan(state, RoundContext(0, np.array([0]), sim.spec))
             if t.kind is TaskKind.SIGNATURE]
    spec = tasks[0].signature
    assert spec == SignatureSpec(p=2, per_class=True, center=True, mean=(0.1,), std=(0.3,),
                                 svd="exact", seed=state.seed, budget=40)
    assert tasks[0].meta == {}
    (result,) = sim.executor.run(tasks[:1], 0)
    data = sim.federation.clients[0]
    expected, labels = signature.client_signature(data.train_x, data.train_y, p=2, per_class=True,
                                           center=True, mean=[0.1], std=[0.3], svd="exact",
                                           seed=state.seed, budget=40)
    np.testing.assert_array_equal(result.signature, expected.astype(np.float32))
    np.testing.assert_array_equal(result.signature_labels, labels)
