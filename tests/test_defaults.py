"""Clusters out of the box: the data-driven rules behind every clustered method's defaults."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import tiny_config

from clusterfed.algorithms import ALGORITHMS, RoundContext, Setup, build_algorithm
from clusterfed.algorithms.cfl import maths as cfl_math
from clusterfed.client import ClientResult, TaskKind, TrainSpec
from clusterfed.clustering import precomputed as pc
from clusterfed.config import merge
from clusterfed.sim.simulation import run_config

# CFL's estimated gamma (Eq. 38 read backwards) ---------------------------------------------

SIM = np.array([[1.0, 0.8, -0.1, 0.0],
                [0.8, 1.0, 0.1, -0.2],
                [-0.1, 0.1, 1.0, 0.6],
                [0.0, -0.2, 0.6, 1.0]])


def test_nearest_own_side_and_gamma_hat_by_hand():
    a, b = np.array([0, 1]), np.array([2, 3])
    np.testing.assert_allclose(cfl_math.nearest_own_side(SIM, a, b), [0.8, 0.8, 0.6, 0.6])
    # gamma_hat from the weakest nearest-own-side similarity, 0.6: sqrt(0.4 / 2).
    assert cfl_math.estimated_gamma(SIM, a, b) == pytest.approx(np.sqrt(0.2))
    # A one-client side has no evidence: s = -1, gamma_hat = 1.
    lone = cfl_math.nearest_own_side(SIM, np.array([0]), np.array([1, 2, 3]))
    np.testing.assert_allclose(lone, [-1.0, 0.1, 0.6, 0.6])
    assert cfl_math.estimated_gamma(SIM, np.array([0]), np.array([1, 2, 3])) == 1.0


def test_split_is_separated_compares_gamma_hat_with_a_share_of_the_bound():
    a, b = np.array([0, 1]), np.array([2, 3])
    # alpha_cross_max = 0.1, so the bound is sqrt(0.45) = 0.6708; gamma_hat = 0.4472.
    ratio = np.sqrt(0.2) / np.sqrt(0.45)                      # 0.667
    assert cfl_math.split_is_separated(SIM, a, b, ratio + 1e-6)
    assert not cfl_math.split_is_separated(SIM, a, b, ratio - 1e-6)
    assert not cfl_math.split_is_separated(SIM, np.array([0]), np.array([1, 2, 3]), 1.0)
    with pytest.raises(ValueError):
        cfl_math.split_is_separated(SIM, a, b, 0.0)


def test_cfl_splits_only_a_similarity_that_stays_separated():
    """Acceptance "estimated": a bipartition is tested on the similarity averaged over
    `similarity_memory` rounds, and only once that many rounds are in: a cluster that shows
    groups every round splits in the third round, not before; updates in random directions
    never split it."""
    algo = build_algorithm({"name": "cfl", "rho": None, "similarity_memory": 3})
    spec = TrainSpec(lr=0.1, batch_size=10)
    grouped = np.zeros((4, 50))
    grouped[:, :3] = [[1, 0.1, 0], [1, -0.1, 0], [-1, 0, 0.1], [-1, 0, -0.1]]  # {0, 1}, {2, 3}
    rng = np.random.default_rng(0)
    noise = [rng.standard_normal((4, 50)) for _ in range(6)]

    def rounds(updates_per_round):
        state = algo.init(Setup(4, np.zeros(50, np.float32), np.full(4, 10), 0))
        out = []
        for rnd, ups in enumerate(updates_per_round):
            results = [ClientResult(c, TaskKind.TRAIN, 10, update=np.asarray(u, np.float32),
                                    loss=1.0, meta={"leaf": 0}) for c, u in enumerate(ups)]
            upd = algo.update(state, RoundContext(rnd, np.arange(4), spec), results)
            state = upd.state
            out.append([e["type"] for e in upd.events])
        return out

    split = rounds([grouped] * 3)
    assert split == [[], [], ["split"]], split
    assert all("split" not in events for events in rounds(noise))


def test_a_converged_clusters_zero_sum_updates_split_under_the_papers_rule_only():
    """The over-splitting of cfl.md's "Fig. 8's structure at full data": inside a converged
    cluster of m = 5 the updates are deviations that sum to zero, pairwise cosine about
    -1/(m-1) = -0.25, mean update norm near 0. The paper's rule (rho 0.25, gamma_max 0.1)
    splits it: every bipartition has alpha_cross_max < 0. The estimated rule does not: its
    gamma_hat, read from the same similarities, equals the bound."""
    rng = np.random.default_rng(0)
    simplex = np.zeros((5, 40))
    simplex[:, :5] = np.eye(5) - 0.2                     # rows sum to zero, cosines -0.25
    spec = TrainSpec(lr=0.1, batch_size=10)

    def events(options):
        algo = build_algorithm({"name": "cfl", **options})
        state = algo.init(Setup(5, np.zeros(40, np.float32), np.full(5, 10), 0))
        seen = []
        for rnd in range(12):
            ups = simplex + 0.01 * rng.standard_normal(simplex.shape)
            results = [ClientResult(c, TaskKind.TRAIN, 10, update=np.asarray(u, np.float32),
                                    loss=1.0, meta={"leaf": 0}) for c, u in enumerate(ups)]
            upd = algo.update(state, RoundContext(rnd, np.arange(5), spec), results)
            state = upd.state
            seen += [e["type"] for e in upd.events]
        return seen

    assert "split" in events({"acceptance": "fixed"})
    assert "split" not in events({})


def test_gradient_mode_splits_by_the_gradients_not_the_updates():
    """Updates group {0, 1} vs {2, 3}; full-batch gradients group {0, 2} vs {1, 3}. With
    similarity_from=gradients the split must follow the gradients."""
    algo = build_algorithm({"name": "cfl", "eps1": 0.5, "eps2": 1.0, "acceptance": "fixed",
                            "similarity_from": "gradients"})
    state = algo.init(Setup(4, np.zeros(2, np.float32), np.full(4, 10), 0))
    updates = [[2, 0.1], [2, -0.1], [-2, 0.1], [-2, -0.1]]
    gradients = [[1, 0.05], [-1, 0.05], [1, -0.05], [-1, -0.05]]
    results = [ClientResult(c, TaskKind.TRAIN, 10, update=np.asarray(u, np.float32), loss=1.0,
                            meta={"leaf": 0}) for c, u in enumerate(updates)]
    results += [ClientResult(c, TaskKind.GRADIENT, 10, update=np.asarray(g, np.float32),
                             loss=1.0, meta={"leaf": 0}) for c, g in enumerate(gradients)]
    upd = algo.update(state, RoundContext(0, np.arange(4), TrainSpec(lr=0.1, batch_size=10)),
                      results)
    (event,) = upd.events
    assert event["type"] == "split" and event["parts"] == [[0, 2], [1, 3]]


# The number of clusters from a distance matrix -----------------------------------------------


def _distances(points: np.ndarray) -> np.ndarray:
    return np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))


def _average_cut(d: np.ndarray):
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    tree = linkage(squareform(d, checks=False), "average")
    return lambda k: fcluster(tree, t=k, criterion="maxclust")


def test_substantial_clusters_sees_nested_groups_that_the_mean_silhouette_merges():
    """Four tight groups in two pairs (like rotations by 0/180 and 90/270 degrees)."""
    rng = np.random.default_rng(0)
    centres = np.array([[0, 0], [5, 0], [40, 0], [45, 0]], dtype=float)
    points = np.concatenate([c + 0.3 * rng.standard_normal((5, 2)) for c in centres])
    d = _distances(points)
    truth = np.repeat(np.arange(4), 5)
    best, _ = pc.best_by_silhouette(d, _average_cut(d), 10)
    assert best.max() + 1 == 2                      # the mean silhouette stops at the pairs
    found, scores = pc.substantial_clusters(d, _average_cut(d), 10)
    np.testing.assert_array_equal(found, truth)
    assert scores[4] >= pc.NO_STRUCTURE


def test_substantial_clusters_keeps_one_cluster_without_structure():
    rng = np.random.default_rng(1)
    d = _distances(rng.standard_normal((20, 30)))
    found, scores = pc.substantial_clusters(d, _average_cut(d), 10)
    assert found.max() == 0 and all(v < pc.NO_STRUCTURE for v in scores.values())


def test_detail_below_a_tenth_of_the_separation_is_no_cluster():
    """Two far groups, each made of two subgroups 1/100 of the way apart: two clusters."""
    rng = np.random.default_rng(2)
    centres = np.array([[0, 0], [0.5, 0], [50, 0], [50.5, 0]])
    points = np.concatenate([c + 0.02 * rng.standard_normal((5, 2)) for c in centres])
    d = _distances(points)
    found, _ = pc.substantial_clusters(d, _average_cut(d), 10)
    np.testing.assert_array_equal(found, np.repeat([0, 1], 10))
    # Without the separation floor the silhouette alone cuts the detail too.
    detail, _ = pc.substantial_clusters(d, _average_cut(d), 10, min_separation=0.0)
    assert detail.max() + 1 == 4


def test_a_lone_point_is_no_cluster():
    points = np.array([[0.0], [0.1], [0.2], [0.3], [10.0]])
    d = _distances(points)
    found, scores = pc.substantial_clusters(d, _average_cut(d), 3)
    assert 2 not in scores and found.max() == 0
    best, _ = pc.best_by_silhouette(d, _average_cut(d), 3, None)
    assert np.bincount(best).min() >= 2


# Defaults on small federations ----------------------------------------------------------------


def _run(name: str, scenario: dict, rounds: int = 40, **options) -> dict:
    """Digits over 20 clients, the benchmark's training, the method at its defaults."""
    base = tiny_config(name, seed=0, scenario={"clients": 20, **scenario},
                       model={"name": "mlp"},
                       train={"rounds": rounds, "participation": 1.0, "local_epochs": 3,
                              "batch_size": 10, "lr": 0.05, "momentum": 0.5},
                       eval={"every": rounds}, run={"checkpoint_every": 0})
    return run_config(merge(base, {"algorithm": {"name": name, **options}}))["clustering"]


def test_cfl_default_stops_on_an_iid_federation_where_the_fixed_gamma_splits():
    assert _run("cfl", {"kind": "iid"})["n_clusters"] == 1
    assert _run("cfl", {"kind": "iid"}, acceptance="fixed")["n_clusters"] > 1


@pytest.mark.parametrize("name", ["flhc", "pacfl"])
def test_default_cut_finds_label_groups_where_the_papers_fixed_threshold_does_not(name):
    groups = {"kind": "label_groups", "clusters": 4}
    assert _run(name, groups, rounds=12)["ari"] == 1.0
    fixed = {"flhc": {"threshold_mode": "absolute", "threshold": 3.0, "metric": "l2",
                      "linkage": "ward"},
             "pacfl": {"beta": 3.5}}[name]
    assert _run(name, groups, rounds=12, **fixed)["ari"] < 0.9


def test_every_clustered_method_says_what_it_sees():
    for name in ("cfl", "flhc", "pacfl", "ifca", "lcfl"):
        sees = ALGORITHMS.get(name).sees
        assert sees and sees <= {"concept", "feature", "label"}, name
    assert "concept" not in ALGORITHMS.get("pacfl").sees    # a label swap keeps the images
