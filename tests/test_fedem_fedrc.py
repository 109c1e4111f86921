"""FedEM and FedRC: the E-step, M-step and FedRC's label marginals against hand-worked cases,
FedRC's invariance to label priors by brute force, the two-step rounds, the server averages,
M from the data, and the clusters of small federations."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ctx, tiny_config

from clusterfed.algorithms import Setup, build_algorithm
from clusterfed.algorithms.fedem.algorithm import (
    FedEM,
    component_weights,
    confident_prior,
    log_weights,
    mixture_weights,
    responsibilities,
)
from clusterfed.algorithms.fedrc.algorithm import (
    FedRC,
    label_counts,
    label_marginals,
    robust_responsibilities,
)
from clusterfed.algorithms.options import ClusterCount
from clusterfed.client import ClientResult, TaskKind
from clusterfed.config import merge
from clusterfed.errors import ConfigError
from clusterfed.sim.simulation import run_config


def setup(n: int, d: int = 2, sizes=None) -> Setup:
    sizes = np.full(n, 3) if sizes is None else np.asarray(sizes)
    return Setup(n, np.zeros(d, np.float32), sizes, 0,
                 draw_initial=lambda i: np.full(d, float(i), np.float32))


# The mathematics ---------------------------------------------------------------------------


def test_the_e_step_and_m_step_by_hand():
    # pi = (3/4, 1/4); component 0's losses 0, ln 3, ln 9; component 1's all 0:
    # sample 1: 3/4 : 1/4; sample 2: (3/4)/3 : 1/4 = 1 : 1; sample 3: (3/4)/9 : 1/4 = 1 : 3.
    losses = np.array([[0.0, np.log(3), np.log(9)], [0.0, 0.0, 0.0]])
    q = responsibilities(np.log([0.75, 0.25]), losses)
    np.testing.assert_allclose(q, [[0.75, 0.25], [0.5, 0.5], [0.25, 0.75]])
    np.testing.assert_allclose(mixture_weights(q), [0.5, 0.5])
    # Log-sum-exp: losses of 1000 do not underflow to 0 / 0.
    np.testing.assert_allclose(responsibilities(np.log([0.75, 0.25]), losses + 1000.0), q)
    # A weight of 0 keeps its component at 0 whatever the losses.
    np.testing.assert_allclose(responsibilities(log_weights([1.0, 0.0]), losses[::-1]),
                               [[1.0, 0.0]] * 3)


def test_fedrc_divides_by_each_components_label_marginal_by_hand():
    # Equal losses, omega = (1/2, 1/2), P~ = [[0.8, 0.2], [0.4, 0.6]]:
    # label 0: 1/0.8 : 1/0.4 = 1 : 2; label 1: 1/0.2 : 1/0.6 = 3 : 1.
    gamma = robust_responsibilities(np.log([0.5, 0.5]), np.zeros((2, 3)), np.array([0, 0, 1]),
                                    np.array([[0.8, 0.2], [0.4, 0.6]]))
    np.testing.assert_allclose(gamma, [[1 / 3, 2 / 3], [1 / 3, 2 / 3], [0.75, 0.25]])
    # Counts: component 0 holds 2/3 of label 0 and 3/4 of label 1; component 1 the rest.
    np.testing.assert_allclose(label_counts(gamma, np.array([0, 0, 1]), 3),
                               [[2 / 3, 0.75, 0.0], [4 / 3, 0.25, 0.0]])
    # P~ from counts [[3, 1], [0, 2]] with one pseudo-count each: [[4, 2] / 6, [1, 3] / 4].
    np.testing.assert_allclose(label_marginals(np.array([[3.0, 1.0], [0.0, 2.0]]), 1.0),
                               [[4 / 6, 2 / 6], [1 / 4, 3 / 4]])


def test_fedrc_ignores_components_that_differ_by_their_label_prior_alone():
    """Brute force: components whose log-likelihoods differ only by log P~(y; theta_k) (the
    same P(x | y), other label marginals: label shift) leave FedRC's responsibilities at
    omega for every sample, whatever the client's label proportions; FedEM's follow the
    labels, and its pi moves toward the component whose label prior matches the client's."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        k, c, n = rng.integers(2, 5), rng.integers(2, 6), rng.integers(1, 30)
        marginals = label_marginals(rng.exponential(size=(k, c)) * 10, 1.0)
        omega = rng.dirichlet(np.ones(k))
        labels = rng.integers(0, c, n)
        shared = rng.exponential(size=n)                  # -log P(x | y), the same for all k
        losses = shared[None] - np.log(marginals[:, labels])
        gamma = robust_responsibilities(np.log(omega), losses, labels, marginals)
        np.testing.assert_allclose(gamma, np.repeat(omega[None], n, axis=0), rtol=1e-9)
    # FedEM on the same kind of losses: a client holding only label 0 is pulled toward the
    # component with the larger P~(0).
    marginals = np.array([[0.9, 0.1], [0.1, 0.9]])
    losses = 0.3 - np.log(marginals[:, [0, 0, 0]])
    pi = mixture_weights(responsibilities(np.log([0.5, 0.5]), losses))
    np.testing.assert_allclose(pi, [0.9, 0.1])
    gamma = robust_responsibilities(np.log([0.5, 0.5]), losses, np.array([0, 0, 0]), marginals)
    np.testing.assert_allclose(mixture_weights(gamma), [0.5, 0.5])


def test_the_server_weights_each_component_by_samples_or_responsibilities():
    pi = np.array([[0.9, 0.1], [0.2, 0.8]])
    np.testing.assert_allclose(component_weights(np.array([10, 30]), pi, "samples", "samples"),
                               [[10, 10], [30, 30]])
    np.testing.assert_allclose(
        component_weights(np.array([10, 30]), pi, "samples", "responsibilities"),
        [[9, 1], [6, 24]])
    np.testing.assert_allclose(confident_prior(np.array([1, 0]), 3, 0.8),
                               [[0.1, 0.8, 0.1], [0.8, 0.1, 0.1]])
    np.testing.assert_allclose(confident_prior(np.array([0, 0]), 1, 0.8), [[1.0], [1.0]])


# The rounds --------------------------------------------------------------------------------


def losses_result(client: int, losses, labels=None) -> ClientResult:
    losses = np.asarray(losses, np.float64)
    return ClientResult(client, TaskKind.LOSSES, losses.shape[1], losses=losses,
                        labels=None if labels is None else np.asarray(labels))


def train_result(client: int, component: int, update, n: int) -> ClientResult:
    return ClientResult(client, TaskKind.TRAIN, n, update=np.asarray(update, np.float32),
                        meta={"component": component})


@pytest.mark.parametrize("aggregation", ["samples", "responsibilities"])
def test_a_round_is_the_e_step_then_one_weighted_training_per_component(aggregation):
    algo = FedEM(k_choice=ClusterCount(k=2), aggregation=aggregation)
    state = algo.init(setup(3, sizes=[3, 2, 5]))
    np.testing.assert_array_equal(state.models, [[0.0, 0.0], [1.0, 1.0]])   # two draws
    losses = algo.plan(state, ctx(0, [0, 1]))
    assert [(t.client, t.kind) for t in losses] == [(0, TaskKind.LOSSES), (1, TaskKind.LOSSES)]
    assert losses[0].loss.per_sample and not losses[0].loss.labels
    np.testing.assert_array_equal(losses[0].params, state.models)
    # Client 0: the hand-worked case above from pi = (1/2, 1/2); client 1 prefers component 1.
    upd = algo.update(state, ctx(0, [0, 1]), [
        losses_result(0, [[0.0, np.log(3), np.log(9)], [0.0, 0.0, 0.0]]),
        losses_result(1, [[5.0, 5.0], [0.0, 0.0]])])
    assert not upd.round_done
    q0 = np.array([[0.5, 0.5], [0.25, 0.75], [0.1, 0.9]])
    np.testing.assert_allclose(upd.state.pi[0], q0.mean(axis=0))
    np.testing.assert_allclose(upd.state.pi[2], [0.5, 0.5])         # not sampled
    assert algo.clusters(upd.state).assignment.tolist() == [1, 1, 0]
    train = algo.plan(upd.state, ctx(0, [0, 1], step=1))
    assert [(t.client, t.meta["component"]) for t in train] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    np.testing.assert_allclose(train[1].objective.sample_weights, q0[:, 1], rtol=1e-6)
    np.testing.assert_array_equal(train[2].params, state.models[0])
    assert [t.own_model for t in train] == [False, True, False, True]
    done = algo.update(upd.state, ctx(0, [0, 1], step=1), [
        train_result(0, 0, [1.0, 0.0], 3), train_result(0, 1, [2.0, 0.0], 3),
        train_result(1, 0, [0.0, 1.0], 2), train_result(1, 1, [0.0, 2.0], 2)])
    assert done.round_done
    pi = upd.state.pi
    w = np.array([[3, 3], [2, 2]]) * (pi[:2] if aggregation == "responsibilities" else 1)
    expected = [[w[0, 0] / w[:, 0].sum(), w[1, 0] / w[:, 0].sum()],
                [1 + 2 * w[0, 1] / w[:, 1].sum(), 1 + 2 * w[1, 1] / w[:, 1].sum()]]
    np.testing.assert_allclose(done.state.models, expected, rtol=1e-6)


def test_fedrc_asks_for_labels_and_keeps_each_clients_label_counts():
    algo = FedRC(k_choice=ClusterCount(k=2))
    state = algo.init(setup(2))
    assert algo.plan(state, ctx(0, [0]))[0].loss.labels
    upd = algo.update(state, ctx(0, [0]), [losses_result(0, np.zeros((2, 3)), [0, 2, 2])])
    # No counts yet: P~ uniform, gamma = omega; label counts widen to the 3 labels seen.
    np.testing.assert_allclose(upd.state.label_counts[0], [[0.5, 0.0, 1.0], [0.5, 0.0, 1.0]])
    assert upd.state.label_counts.shape == (2, 2, 3)
    # Next round: the counts' marginals divide (equal here, so gamma is still omega).
    again = algo.update(upd.state, ctx(1, [1]), [losses_result(1, np.zeros((2, 1)), [1])])
    np.testing.assert_allclose(again.state.pi[1], [0.5, 0.5])


def test_m_from_the_data_starts_each_component_from_a_cluster_of_updates():
    algo = FedEM(select_round=1, prior_confidence=0.8)
    state = algo.init(setup(6))
    assert state.models.shape == (1, 2) and not state.selected
    warm = algo.plan(state, ctx(0, [0, 3]))
    assert [(t.kind, t.client) for t in warm] == [(TaskKind.TRAIN, 0), (TaskKind.TRAIN, 3)]
    state = algo.update(state, ctx(0, [0, 3]), [train_result(c, 0, [1.0, 0.0], 3)
                                                for c in (0, 3)]).state
    np.testing.assert_allclose(state.models, [[1.0, 0.0]])           # FedAvg
    assert sorted(t.client for t in algo.plan(state, ctx(1, [2]))) == list(range(6))
    ups = [[1.0, 0.02], [1.0, -0.02], [1.02, 0.0], [-1.0, 0.01], [-1.0, -0.01], [-0.98, 0.0]]
    new = algo.update(state, ctx(1, [2]), [train_result(c, 0, u, 3)
                                           for c, u in enumerate(ups)]).state
    assert new.selected and new.models.shape == (2, 2)
    np.testing.assert_allclose(new.models, [[2.0067, 0.0], [0.0067, 0.0]], atol=1e-4)
    np.testing.assert_allclose(new.pi[:, 0], [0.8, 0.8, 0.8, 0.2, 0.2, 0.2])
    assert algo.plan(new, ctx(2, [0]))[0].kind is TaskKind.LOSSES


@pytest.mark.parametrize("options", [{"components": 0}, {"select_round": -1},
                                     {"initial_pi": "random"}, {"prior_confidence": 0.0},
                                     {"aggregation": "models"}, {"weighting": "labels"}])
@pytest.mark.parametrize("name", ["fedem", "fedrc"])
def test_bad_options_raise_a_config_error(name, options):
    with pytest.raises(ConfigError):
        build_algorithm({"name": name, **options})
    with pytest.raises(ConfigError, match="label_prior"):
        build_algorithm({"name": "fedrc", "label_prior": 0.0})


# Small federations -------------------------------------------------------------------------


def small_run(name: str, kind: str, clusters: int, **options) -> dict:
    cfg = tiny_config(name, scenario={"kind": kind, "clients": 4, "clusters": clusters,
                                      "samples_per_client": 150,
                                      "test_samples_per_client": 20},
                      model={"name": "mlp", "hidden": 32},
                      train={"rounds": options.pop("rounds", 5), "participation": 1.0,
                             "local_epochs": 2, "batch_size": 10, "lr": 0.05,
                             "momentum": 0.5},
                      eval={"every": 100}, run={"checkpoint_every": 0, "threads": 1})
    return run_config(merge(cfg, {"algorithm": {"name": name, **options}}))["clustering"]


@pytest.mark.parametrize("name", ["fedem", "fedrc"])
def test_an_iid_federation_gives_one_component(name):
    """(The contract suite checks each recovers the label-swap toy mixture, ARI >= 0.9.)"""
    clustering = small_run(name, "iid", 1, select_round=2)
    assert clustering["n_clusters"] == 1


def test_label_shift_alone_splits_fedem_but_not_fedrc():
    """Two groups of clients with disjoint label sets (label shift, no concept shift), two
    components from random starts (the papers' fixed M = K = 2): FedEM gives each group its
    component; FedRC, dividing by each component's label marginal, keeps all in one."""
    fedem = small_run("fedem", "label_groups", 2, components=2)
    assert fedem["ari"] == 1.0
    fedrc = small_run("fedrc", "label_groups", 2, components=2)
    assert fedrc["n_clusters"] == 1
