"""FedAvg and Local against hand-computed cases; sampling; aggregation maths."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed.algorithms import ALGORITHMS, RoundContext, Setup, build_algorithm
from clusterfed.algorithms.aggregate import aggregation_weights, weighted_mean
from clusterfed.client import ClientResult, TaskKind, TrainSpec
from clusterfed.errors import ConfigError
from clusterfed.sampling import clients_per_round, sample_clients, task_seed

pytestmark = pytest.mark.fast

SPEC = TrainSpec(lr=0.1, batch_size=10)


def result(client: int, update, n: int) -> ClientResult:
    return ClientResult(client, TaskKind.TRAIN, n, update=np.asarray(update, np.float32), loss=1.0)


def test_weighted_mean_by_hand():
    v = np.array([[1.0, 2.0], [3.0, 6.0], [0.0, -4.0]])
    # weights 1, 2, 1 -> (1*[1,2] + 2*[3,6] + 1*[0,-4]) / 4 = [7/4, 10/4]
    np.testing.assert_allclose(weighted_mean(v, np.array([1, 2, 1])), [1.75, 2.5])
    with pytest.raises(ValueError):
        weighted_mean(v, np.zeros(3))
    with pytest.raises(ValueError):
        aggregation_weights(np.ones(2), "median")


def test_weighted_mean_in_blocks_is_the_one_matrix_product(monkeypatch):
    """Columns in blocks (a short last one) and a list of vectors give the float64 product of
    the whole stacked matrix bit for bit: the blocks only bound the memory."""
    from clusterfed.algorithms import aggregate

    monkeypatch.setattr(aggregate, "BLOCK", 7)
    rng = np.random.default_rng(0)
    v = rng.normal(size=(5, 30)).astype(np.float32)
    w = rng.uniform(1, 50, 5)
    whole = ((w / w.sum()) @ v.astype(np.float64)).astype(np.float32)
    assert np.array_equal(weighted_mean(v, w), whole)
    assert np.array_equal(weighted_mean(list(v), w), whole)
    with pytest.raises(ValueError, match="one length"):
        weighted_mean([v[0], v[1][:20]], w[:2])


def test_fedavg_sample_weighted_update_by_hand():
    algo = build_algorithm({"name": "fedavg"})
    state = algo.init(Setup(4, np.array([1.0, 1.0, 1.0], np.float32), np.array([10, 30, 60, 5]),
                            0))
    ctx = RoundContext(0, np.array([0, 1, 2]), SPEC)
    tasks = algo.plan(state, ctx)
    assert [t.client for t in tasks] == [0, 1, 2]
    assert all(t.kind is TaskKind.TRAIN and t.train == SPEC for t in tasks)
    results = [result(0, [1, 0, 0], 10), result(1, [0, 1, 0], 30), result(2, [0, 0, 1], 60)]
    new = algo.update(state, ctx, results).state
    # w + (10 e1 + 30 e2 + 60 e3) / 100
    np.testing.assert_allclose(new.model, [1.1, 1.3, 1.6], rtol=1e-6)
    np.testing.assert_array_equal(state.model, [1, 1, 1])  # the old state is not mutated
    view = algo.clusters(new)
    assert view.num_clusters == 1 and list(view.assignment) == [0, 0, 0, 0]


def test_fedavg_uniform_and_empty_round():
    algo = build_algorithm({"name": "fedavg", "weighting": "uniform"})
    state = algo.init(Setup(2, np.zeros(2, np.float32), np.array([1, 99]), 0))
    ctx = RoundContext(0, np.array([0, 1]), SPEC)
    new = algo.update(state, ctx, [result(0, [2, 0], 1), result(1, [0, 4], 99)]).state
    np.testing.assert_allclose(new.model, [1.0, 2.0])
    # Every result rejected: the model stays.
    np.testing.assert_array_equal(algo.update(new, ctx, []).state.model, new.model)


def test_local_trains_every_client_every_round_by_default():
    # The PACFL authors' main_local.py: SOLO clients do not wait to be sampled.
    algo = build_algorithm({"name": "local"})
    state = algo.init(Setup(3, np.zeros(2, np.float32), np.array([5, 5, 5]), 0))
    assert [t.client for t in algo.plan(state, RoundContext(0, np.array([1]), SPEC))] == [0, 1, 2]
    with pytest.raises(ValueError, match="clients must be one of all, sampled"):
        build_algorithm({"name": "local", "clients": "some"})


def test_local_keeps_each_clients_model():
    algo = build_algorithm({"name": "local", "clients": "sampled"})
    state = algo.init(Setup(3, np.zeros(2, np.float32), np.array([5, 5, 5]), 0))
    ctx = RoundContext(0, np.array([0, 2]), SPEC)
    assert [t.client for t in algo.plan(state, ctx)] == [0, 2]
    new = algo.update(state, ctx, [result(0, [1, 1], 5), result(2, [-1, 3], 5)]).state
    np.testing.assert_array_equal(new.models, [[1, 1], [0, 0], [-1, 3]])
    view = algo.clusters(new)
    assert list(view.assignment) == [0, 1, 2] and view.num_clusters == 3


def test_algorithm_config_errors():
    with pytest.raises(ConfigError, match="valid algorithms: .*fedavg.*local"):
        build_algorithm({"name": "fedsgd"})
    with pytest.raises(ConfigError, match="algorithm.mu in section 'algorithm'"):
        build_algorithm({"name": "fedavg", "mu": 0.1})
    with pytest.raises(ConfigError, match="weighting"):
        build_algorithm({"name": "fedavg", "weighting": "median"})
    assert {"fedavg", "local"} <= set(ALGORITHMS.names())


def test_sampling_counts_and_fractions():
    assert clients_per_round(0.1, 100) == 10
    assert clients_per_round(1.0, 7) == 7
    assert clients_per_round(0.01, 20) == 1   # never zero clients
    assert clients_per_round(5, 100) == 5
    assert clients_per_round(500, 100) == 100


def test_sampling_is_uniform_without_replacement_and_seeded():
    a = sample_clients(3, 4, 50, 0.2)
    assert len(a) == 10 and len(set(a)) == 10 and list(a) == sorted(a)
    np.testing.assert_array_equal(a, sample_clients(3, 4, 50, 0.2))
    assert not np.array_equal(a, sample_clients(3, 5, 50, 0.2))
    # Uniform: over many rounds every client is picked about equally often.
    counts = np.bincount(np.concatenate([sample_clients(0, r, 20, 5) for r in range(4000)]),
                         minlength=20)
    assert counts.min() > 0.9 * 1000 and counts.max() < 1.1 * 1000


def test_task_seeds_differ_by_round_step_and_client():
    seeds = {task_seed(0, r, s, c) for r in range(3) for s in range(2) for c in range(5)}
    assert len(seeds) == 30
    assert task_seed(1, 0, 0, 0) != task_seed(0, 0, 0, 0)
