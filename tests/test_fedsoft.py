"""FedSoft: importance weights, selection, the proximal term and the centre update against
hand-worked cases; one round through plan/update; clusters against the truth and on iid."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import comparable, ctx, tiny_config

from clusterfed.algorithms import Setup
from clusterfed.algorithms.fedsoft.algorithm import (
    FedSoft,
    centre_update,
    centre_weights,
    importance_weights,
    proximal_term,
    select_clients,
    served_centres,
)
from clusterfed.algorithms.options import ClusterCount
from clusterfed.client import ClientResult, TaskKind
from clusterfed.config import merge
from clusterfed.errors import ConfigError
from clusterfed.sim.simulation import Simulation, resume_run, run_config


def setup(sizes, d: int = 2) -> Setup:
    # Draw i is the constant vector i: the k centres start apart and known.
    return Setup(len(sizes), np.zeros(d, np.float32), np.asarray(sizes), 0,
                 draw_initial=lambda i: np.full(d, float(i), np.float32))


def test_importance_is_the_share_of_samples_each_centre_fits_best_smoothed_by_sigma():
    losses = np.array([[0.1, 0.2, 0.9, 0.3, 0.5],     # centre 0
                       [0.4, 0.2, 0.1, 0.8, 0.2],     # centre 1 (sample 1 ties: centre 0)
                       [0.5, 0.6, 0.7, 0.9, 0.9]])    # centre 2: never the best
    # argmins 0, 0, 1, 0, 1 -> counts 3, 2, 0 of 5 -> max(., sigma)
    np.testing.assert_allclose(importance_weights(losses, 0.01), [0.6, 0.4, 0.01])
    np.testing.assert_allclose(importance_weights(losses, 0.5), [0.6, 0.5, 0.5])


def test_hard_importance_is_one_on_the_centre_of_most_samples_sigma_elsewhere():
    losses = np.array([[0.1, 0.2, 0.9, 0.3, 0.5],     # counts 3, 2, 0 as above
                       [0.4, 0.2, 0.1, 0.8, 0.2],
                       [0.5, 0.6, 0.7, 0.9, 0.9]])
    np.testing.assert_allclose(importance_weights(losses, 0.01, hard=True), [1.0, 0.01, 0.01])
    tie = np.array([[0.1, 0.9], [0.9, 0.1]])          # 1 and 1: the lowest centre
    np.testing.assert_allclose(importance_weights(tie, 0.01, hard=True), [1.0, 0.01])


def test_hard_importance_in_a_round_gives_each_centre_only_its_clients():
    algo = FedSoft(k_choice=ClusterCount(k=2), sigma=0.01, importance="hard")
    state = algo.init(setup([4, 4]))
    results = [ClientResult(0, TaskKind.LOSSES, 4, losses=np.array([[1, 1, 1, 9], [2, 2, 2, 1.0]])),
               ClientResult(1, TaskKind.LOSSES, 4, losses=np.array([[5, 5, 1, 5], [1, 1, 5, 1.0]]))]
    state = algo.update(state, ctx(0, [0, 1]), results).state
    np.testing.assert_allclose(state.importance, [[1.0, 0.01], [0.01, 1.0]])


def test_centre_weights_are_importance_times_samples_normalised_per_centre():
    u = np.array([[0.75, 0.25], [0.5, 0.5]])
    v = centre_weights(u, np.array([10, 30]))
    # centre 0: 7.5 and 15 -> 1/3, 2/3; centre 1: 2.5 and 15 -> 1/7, 6/7
    np.testing.assert_allclose(v, [[1 / 3, 2 / 3], [1 / 7, 6 / 7]])


def test_selection_draws_k_clients_per_centre_with_probabilities_v():
    v = np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])
    np.testing.assert_array_equal(select_clients(v, None, np.random.default_rng(0)), v)
    rng = np.random.default_rng(1)
    one = np.mean([select_clients(v, 1, rng) for _ in range(4000)], axis=0)
    np.testing.assert_allclose(one, v, atol=0.03)   # K = 1: Pr(c in S_s) = v_{s,c}
    two = select_clients(v, 2, rng)
    np.testing.assert_allclose(two.sum(axis=1), [1.0, 1.0])   # 1/K on K clients a centre
    assert ((two == 0.5).sum(axis=1) == 2).all()


def test_the_proximal_term_is_one_term_with_mu_and_anchor():
    u = np.array([0.5, 0.25])
    centres = np.array([[0.0, 0.0], [3.0, 6.0]], np.float32)
    mu, anchor = proximal_term(u, centres, 0.2)
    # mu = 0.2 * 0.75; a = (0.5 * 0 + 0.25 * (3, 6)) / 0.75 = (1, 2)
    assert mu == pytest.approx(0.15)
    np.testing.assert_allclose(anchor, [1.0, 2.0], rtol=1e-6)
    # Same gradient as (lambda/2) sum_s u_s ||w - theta_s||^2 at any w.
    w = np.array([0.7, -1.3])
    np.testing.assert_allclose(mu * (w - anchor), 0.2 * (u[:, None] * (w - centres)).sum(0),
                               rtol=1e-6)


def test_centre_update_is_the_weighted_mean_and_keeps_a_centre_without_clients():
    centres = np.array([[9.0, 9.0], [8.0, 8.0], [7.0, 7.0]], np.float32)
    models = np.array([[0.0, 3.0], [6.0, 0.0], [3.0, 3.0]], np.float32)
    weights = np.array([[0.5, 0.25, 0.25], [0.0, 0.2, 0.2], [0.0, 0.0, 0.0]])
    got = centre_update(centres, weights, models)
    # centre 0: 0.5 (0, 3) + 0.25 (6, 0) + 0.25 (3, 3); centre 1: the mean of models 1 and 2
    np.testing.assert_allclose(got, [[2.25, 2.25], [4.5, 1.5], [7.0, 7.0]])


def test_a_round_estimates_trains_proximally_and_moves_the_centres():
    algo = FedSoft(k_choice=ClusterCount(k=2), lam=0.5, sigma=0.1)
    state = algo.init(setup([4, 2, 4]))
    np.testing.assert_array_equal(state.centres, [[0, 0], [1, 1]])
    tasks = algo.plan(state, ctx(0, [0, 2]))
    assert [(t.client, t.kind) for t in tasks] == [(0, TaskKind.LOSSES), (2, TaskKind.LOSSES)]
    assert tasks[0].loss.per_sample and tasks[0].params.shape == (2, 2)
    # Client 0: 3 of 4 samples best under centre 0; client 2: all under centre 1.
    results = [ClientResult(0, TaskKind.LOSSES, 4, losses=np.array([[1, 1, 1, 9], [2, 2, 2, 1.0]])),
               ClientResult(2, TaskKind.LOSSES, 4, losses=np.array([[5, 5, 5, 5], [1, 1, 1, 1.0]]))]
    upd = algo.update(state, ctx(0, [0, 2]), results)
    assert not upd.round_done
    np.testing.assert_allclose(upd.state.importance, [[0.75, 0.25], [0.5, 0.5], [0.1, 1.0]])
    train = algo.plan(upd.state, ctx(0, [0, 2], step=1))
    assert [(t.client, t.kind) for t in train] == [(0, TaskKind.TRAIN), (2, TaskKind.TRAIN)]
    # Client 0: mu = 0.5 * 1.0, anchor = 0.75 (0, 0) + 0.25 (1, 1); from its personal model 0.
    assert train[0].objective.prox_mu == pytest.approx(0.5)
    np.testing.assert_allclose(train[0].objective.anchor, [0.25, 0.25])
    # Client 2: mu = 0.5 * 1.1, anchor = (0.1 (0, 0) + 1.0 (1, 1)) / 1.1
    assert train[1].objective.prox_mu == pytest.approx(0.55)
    np.testing.assert_allclose(train[1].objective.anchor, [1 / 1.1] * 2, rtol=1e-6)
    trained = [ClientResult(0, TaskKind.TRAIN, 4, update=np.array([2.0, 0.0], np.float32),
                            loss=0.1),
               ClientResult(2, TaskKind.TRAIN, 4, update=np.array([0.0, 4.0], np.float32),
                            loss=0.1)]
    done = algo.update(upd.state, ctx(0, [0, 2], step=1), trained)
    assert done.round_done
    np.testing.assert_allclose(done.state.personal, [[2, 0], [0, 0], [0, 4]])
    # v_0 = (0.75, 0.1) * 4 normalised; v_1 = (0.25, 1.0) * 4 normalised
    np.testing.assert_allclose(done.state.centres[0], (0.75 * np.array([2, 0]) + 0.1 *
                                                       np.array([0, 4])) / 0.85, rtol=1e-6)
    np.testing.assert_allclose(done.state.centres[1], (0.25 * np.array([2, 0]) +
                                                       np.array([0, 4])) / 1.25, rtol=1e-6)
    # Served: the centre of the largest weight; client 1, never estimated, the most common.
    np.testing.assert_array_equal(algo.clusters(done.state).assignment, [0, 0, 1])
    assert done.metrics["fedsoft"]["importance"][2] == [0.1, 1.0]


def test_local_start_anchor_starts_from_the_proximal_centre_and_keeps_what_it_trained():
    algo = FedSoft(k_choice=ClusterCount(k=2), lam=0.5, sigma=0.1, local_start="anchor")
    state = algo.init(setup([4, 2, 4]))
    state.personal[:] = [[7, 7], [8, 8], [9, 9]]   # last values the anchor start ignores
    results = [ClientResult(0, TaskKind.LOSSES, 4, losses=np.array([[1, 1, 1, 9], [2, 2, 2, 1.0]])),
               ClientResult(2, TaskKind.LOSSES, 4, losses=np.array([[5, 5, 5, 5], [1, 1, 1, 1.0]]))]
    state = algo.update(state, ctx(0, [0, 2]), results).state
    train = algo.plan(state, ctx(0, [0, 2], step=1))
    # u = (0.75, 0.25) and (0.1, 1.0) over centres (0, 0) and (1, 1): the tasks start at a.
    np.testing.assert_allclose(train[0].params, [0.25, 0.25])
    np.testing.assert_allclose(train[1].params, [1 / 1.1] * 2, rtol=1e-6)
    np.testing.assert_allclose(train[0].objective.anchor, train[0].params)
    trained = [ClientResult(0, TaskKind.TRAIN, 4, update=np.array([2.0, 0.0], np.float32),
                            loss=0.1),
               ClientResult(2, TaskKind.TRAIN, 4, update=np.array([0.0, 4.0], np.float32),
                            loss=0.1)]
    done = algo.update(state, ctx(0, [0, 2], step=1), trained)
    np.testing.assert_allclose(done.state.personal,
                               [[2.25, 0.25], [8, 8], [1 / 1.1, 4 + 1 / 1.1]], rtol=1e-6)


def test_between_estimations_only_never_estimated_clients_estimate():
    algo = FedSoft(k_choice=ClusterCount(k=2), tau=2)
    state = algo.init(setup([4, 4, 4]))
    state = algo.update(state, ctx(0, [0]), [
        ClientResult(0, TaskKind.LOSSES, 4, losses=np.ones((2, 4)))]).state
    # Round 1 is no estimation round: client 0 trains at once, client 1 estimates first.
    assert [t.kind for t in algo.plan(state, ctx(1, [0]))] == [TaskKind.TRAIN]
    assert [(t.client, t.kind) for t in algo.plan(state, ctx(1, [0, 1]))] == [
        (1, TaskKind.LOSSES)]
    assert {t.kind for t in algo.plan(state, ctx(2, [0]))} == {TaskKind.LOSSES}


def test_selection_trains_the_union_of_the_centres_draws_the_same_for_a_seed():
    algo = FedSoft(k_choice=ClusterCount(k=2), selection_size=1)
    state = algo.init(setup([4] * 6))
    a = algo.plan(state, ctx(1, np.arange(6), step=1))
    b = algo.plan(state, ctx(1, np.arange(6), step=1))
    assert 1 <= len(a) <= 2 and [t.client for t in a] == [t.client for t in b]


def test_served_centres_fall_back_to_the_most_common():
    u = np.array([[0.2, 0.8], [0.5, 0.5], [0.1, 0.9]])
    np.testing.assert_array_equal(served_centres(u, np.array([0, -1, 3])), [1, 1, 1])


@pytest.mark.parametrize(("options", "message"), [
    ({"k_choice": {"k": 0}}, "k must"), ({"tau": 0}, "tau"), ({"sigma": 0.0}, "sigma"),
    ({"lam": -1.0}, "lam"), ({"selection_size": 0}, "selection_size"),
    ({"select_round": -1}, "select_round"), ({"local_start": "centre"}, "local_start"),
    ({"importance": "argmax"}, "importance")])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        FedSoft(**options)


def fedsoft_run(scenario: dict) -> tuple[dict, int]:
    """The run's clustering and its number of centres S."""
    cfg = tiny_config("fedsoft", scenario=scenario, model={"name": "mlp"},
                      train={"rounds": 6, "participation": 1.0, "local_epochs": 2,
                             "batch_size": 10, "lr": 0.05, "momentum": 0.5},
                      eval={"every": 6}, run={"checkpoint_every": 0, "threads": 1})
    sim = Simulation(merge(cfg, {"algorithm": {"name": "fedsoft", "select_round": 3}}))
    return sim.run()["clustering"], len(sim.state.centres)


def test_k_from_the_data_finds_the_rotations_and_one_cluster_on_iid():
    found, centres = fedsoft_run({"kind": "rotation", "clients": 8, "clusters": 2})
    assert found["ari"] == 1.0 and centres == 2, found
    iid, centres = fedsoft_run({"kind": "iid", "clients": 8})
    assert iid["n_clusters"] == 1 and centres == 1, iid


def test_k_given_needs_an_init_scheme():
    with pytest.raises((ValueError, ConfigError), match="init scheme"):
        FedSoft(k_choice=ClusterCount(k=2)).init(Setup(2, np.zeros(2, np.float32),
                                                       np.array([1, 1]), 0))


def test_an_interrupted_run_resumes_to_the_same_summary_after_s_is_chosen(tmp_path):
    # Half the clients a round: some first estimate outside an estimation round.
    cfg = merge(tiny_config("fedsoft", train={"rounds": 5}, model={"name": "mlp"},
                            run={"checkpoint_every": 2, "threads": 1}, eval={"every": 1}),
                {"algorithm": {"name": "fedsoft", "select_round": 1, "tau": 2}})
    whole = run_config(cfg, tmp_path / "whole")

    def stop(completed, record):
        if completed == 3:
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        run_config(cfg, tmp_path / "broken", callbacks=[stop])
    assert comparable(resume_run(tmp_path / "broken")) == comparable(whole)
    assert (tmp_path / "broken" / "metrics.jsonl").read_text() == \
        (tmp_path / "whole" / "metrics.jsonl").read_text()
