"""FeSEM: the E-step, the M-step and the multi-center loss by hand; K-means against brute
force; a round of the algorithm on made-up updates; clusters of a small federation and one
cluster on an iid one."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from helpers import tiny_config
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms import RoundContext, Setup
from clusterfed.algorithms.fesem.algorithm import (
    FeSEM,
    e_step,
    l2_distances,
    m_step,
    multi_center_loss,
)
from clusterfed.algorithms.options import ClusterCount
from clusterfed.client import ClientResult, TaskKind, TrainSpec
from clusterfed.clustering.kmeans import kmeans_clusters, kmeans_labels
from clusterfed.clustering.similarity import euclidean_distance_matrix
from clusterfed.config import merge
from clusterfed.sim.simulation import run_config

SPEC = TrainSpec(lr=0.1, batch_size=10)
MODELS = np.array([[0.0, 0.0], [1.0, 0.0], [10.0, 10.0], [9.0, 11.0]], np.float32)
CENTRES = np.array([[0.0, 1.0], [10.0, 9.0]], np.float32)


def test_e_step_takes_the_nearest_centre_in_l2():
    d = l2_distances(MODELS, CENTRES)
    # Hand-worked: |(0,0)-(0,1)| = 1, |(0,0)-(10,9)| = sqrt(181); |(1,0)-(0,1)| = sqrt 2; ...
    np.testing.assert_allclose(d, [[1.0, np.sqrt(181)], [np.sqrt(2), np.sqrt(162)],
                                   [np.sqrt(181), 1.0], [np.sqrt(181), np.sqrt(5)]])
    np.testing.assert_array_equal(e_step(d), [0, 0, 1, 1])
    assert e_step(np.array([[2.0, 2.0, 3.0]]))[0] == 0          # a tie goes to the lowest k
    assert multi_center_loss(d, e_step(d)) == pytest.approx(
        (1 + np.sqrt(2) + 1 + np.sqrt(5)) / 4)


@pytest.mark.parametrize("weights, first", [([1, 1, 1, 1], [0.5, 0.0]), ([1, 3, 1, 1],
                                                                         [0.75, 0.0])])
def test_m_step_is_the_weighted_mean_of_each_centres_models(weights, first):
    three = np.vstack([CENTRES, [[5.0, 5.0]]])
    out = m_step(three, MODELS, np.array([0, 0, 1, 1]), np.array(weights, float))
    # Centre 2 has no member: it keeps its model.
    np.testing.assert_allclose(out, [first, [9.5, 10.5], [5.0, 5.0]])


def brute_force_kmeans(points: np.ndarray, k: int) -> np.ndarray:
    """The partition of least within-cluster sum of squares, over every labelling."""
    best, labels = np.inf, None
    for raw in itertools.product(range(k), repeat=len(points)):
        lab = np.array(raw)
        if len(np.unique(lab)) < k:
            continue
        cost = sum(((points[lab == c] - points[lab == c].mean(0)) ** 2).sum() for c in range(k))
        if cost < best - 1e-9:
            best, labels = cost, lab
    return labels


@pytest.mark.parametrize("k", [2, 3])
def test_kmeans_finds_the_least_squares_partition(k):
    points = np.random.default_rng(4).normal(size=(8, 2)) * [3.0, 1.0]
    found = kmeans_labels(points, k, seed=0)
    assert adjusted_rand_score(brute_force_kmeans(points, k), found) == 1.0


def test_k_from_the_data_finds_separated_groups_and_one_in_noise():
    rng = np.random.default_rng(0)
    means = rng.normal(size=(3, 20)) * 5
    truth = np.repeat(np.arange(3), 5)
    points = means[truth] + rng.normal(size=(15, 20)) * 0.5
    found = kmeans_clusters(points, euclidean_distance_matrix(points), seed=1)
    assert adjusted_rand_score(truth, found) == 1.0
    noise = rng.normal(size=(15, 20))
    assert kmeans_clusters(noise, euclidean_distance_matrix(noise), seed=1).max() == 0


def train_result(client: int, centre: int, update, n: int = 10) -> ClientResult:
    return ClientResult(client, TaskKind.TRAIN, n, update=np.asarray(update, np.float32),
                        loss=0.1, meta={"centre": centre})


def test_a_round_trains_from_the_centre_then_reassigns_and_averages():
    algo = FeSEM(k_choice=ClusterCount(k=2), initialisation="random")
    state = algo.init(Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0,
                            draw_initial=lambda i: np.full(2, float(i), np.float32)))
    state = replace(state, centres=CENTRES.copy(), assignment=np.array([0, 0, 1, -1]))
    ctx = RoundContext(3, np.array([0, 1, 2, 3]), SPEC)
    tasks = algo.plan(state, ctx)
    assert [(t.client, t.meta["centre"]) for t in tasks] == [(0, 0), (1, 0), (2, 1), (3, -1)]
    np.testing.assert_array_equal(tasks[3].params, state.base)   # no centre yet: the base
    # Local models: (0,1)+(0,-1)=(0,0); (0,1)+(9,10)=(9,11), now nearer centre 1; (10,9)+(0,1);
    # (0,0)+(1,0) from the base.
    results = [train_result(0, 0, [0, -1]), train_result(1, 0, [9, 10]),
               train_result(2, 1, [0, 1]), train_result(3, -1, [1, 0])]
    upd = algo.update(state, ctx, results)
    np.testing.assert_array_equal(upd.state.assignment, [0, 1, 1, 0])
    np.testing.assert_allclose(upd.state.centres, [[0.5, 0.0], [9.5, 10.5]])
    assert upd.metrics["fesem"]["switched"] == 1
    assert algo.clusters(upd.state).assignment.tolist() == [0, 1, 1, 0]


def test_options_are_checked():
    with pytest.raises(ValueError, match="give k"):
        FeSEM(initialisation="random")
    with pytest.raises(ValueError, match="initialisation"):
        FeSEM(initialisation="kmeans")
    with pytest.raises(ValueError, match="k must be"):
        FeSEM(k_choice=ClusterCount(k=0))


def run(scenario: dict) -> dict:
    cfg = tiny_config("fesem", scenario={"clients": 8, **scenario},
                      train={"rounds": 5, "participation": 1.0, "local_epochs": 2,
                             "batch_size": 10, "lr": 0.05, "momentum": 0.5},
                      eval={"every": 5}, run={"checkpoint_every": 0})
    return run_config(merge(cfg, {"algorithm": {"name": "fesem", "select_round": 3}}))[
        "clustering"]


def test_recovers_rotations_and_finds_one_cluster_on_iid():
    found = run({"kind": "rotation", "clusters": 2})
    assert found["ari"] == 1.0 and found["n_clusters"] == 2
    assert run({"kind": "iid"})["n_clusters"] == 1


def test_the_selection_round_starts_each_centre_at_its_clusters_mean():
    algo = FeSEM(k_choice=ClusterCount(k=2), select_round=0)
    state = algo.init(Setup(4, np.ones(2, np.float32), np.full(4, 10), 0))
    ctx = RoundContext(0, np.array([0, 1, 2, 3]), SPEC)
    tasks = algo.plan(state, ctx)
    assert [t.meta["phase"] for t in tasks] == ["select"] * 4
    updates = [[0, 0], [10, 10], [0, 1], [9, 11]]
    upd = algo.update(state, ctx, [ClientResult(c, TaskKind.TRAIN, 10, loss=0.1,
                                                update=np.asarray(u, np.float32))
                                   for c, u in enumerate(updates)])
    assert upd.state.selected
    np.testing.assert_array_equal(upd.state.assignment, [0, 1, 0, 1])
    # Centres: w + the mean update of each cluster, w = (1, 1).
    np.testing.assert_allclose(upd.state.centres, [[1.0, 1.5], [10.5, 11.5]])


def swap_like_updates(within: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """4 groups of 5 updates of one norm, cosine about `within` inside a group and 0 across:
    the geometry of the benchmark's MNIST label swap (docs/benchmark.md)."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(4), 5)
    shared = np.linalg.qr(rng.normal(size=(400, 4)))[0].T            # 4 orthonormal directions
    noise = rng.normal(size=(20, 400))
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    updates = np.sqrt(within) * shared[truth] + np.sqrt(1 - within) * noise
    return updates.astype(np.float32), truth


def test_k_is_judged_on_squared_l2_so_equal_norm_groups_with_weak_cosines_are_found():
    # Within-group cosine 0.45: cosine silhouettes about 0.45, L2 ones (sqrt of the cosine
    # distance) about 0.25 or below. FeSEM's rule scores K on squared L2, K-means' own
    # dissimilarity, and finds the 4 groups; pure noise stays one cluster.
    from sklearn.metrics import silhouette_samples

    from clusterfed.clustering.precomputed import NO_STRUCTURE

    updates, truth = swap_like_updates(0.45)
    l2 = euclidean_distance_matrix(updates)
    weakest_l2 = min(silhouette_samples(l2, truth, metric="precomputed")[truth == c].mean()
                     for c in range(4))
    assert weakest_l2 < NO_STRUCTURE   # what the rule on plain L2 distances saw
    algo = FeSEM(select_round=0)
    state = algo.init(Setup(20, np.zeros(400, np.float32), np.full(20, 10), 0))
    ctx = RoundContext(0, np.arange(20), SPEC)
    results = [ClientResult(c, TaskKind.TRAIN, 10, loss=0.1, update=u)
               for c, u in enumerate(updates)]
    found = algo.update(state, ctx, results).state.assignment
    assert adjusted_rand_score(truth, found) == 1.0
    noise, _ = swap_like_updates(0.0)
    results = [ClientResult(c, TaskKind.TRAIN, 10, loss=0.1, update=u)
               for c, u in enumerate(noise)]
    assert algo.update(state, ctx, results).state.assignment.max() == 0
