"""LCFL's mathematics: Eq. 2, its assembly from client rows, the ablation metrics, and the
clusterings on a precomputed d (k-medoids against brute force, DBSCAN, hierarchical)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from clusterfed.algorithms.lcfl import loss_distance as ld
from clusterfed.algorithms.lcfl.algorithm import LCFL
from clusterfed.algorithms.options import ClusterCount
from clusterfed.client.work import losses
from clusterfed.clustering import precomputed as pc
from clusterfed.models import FlatModel

pytestmark = pytest.mark.fast


def test_distance_on_a_hand_built_case():
    # L[i, j] = L_i(w_j). d(0,1) = |1 - 3| + |4 - 2| = 4; d(0,2) = |1 - 1.5| + |0.5 - 1| = 1;
    # d(1,2) = |2 - 2| + |1 - 7| = 6.
    lmat = np.array([[1.0, 3.0, 1.5],
                     [4.0, 2.0, 2.0],
                     [0.5, 7.0, 1.0]])
    expected = np.array([[0, 4, 1], [4, 0, 6], [1, 6, 0]], dtype=float)
    np.testing.assert_allclose(ld.loss_distance(lmat), expected)


def test_distance_is_symmetric_non_negative_with_zero_diagonal():
    rng = np.random.default_rng(0)
    d = ld.loss_distance(rng.exponential(size=(30, 30)))
    np.testing.assert_array_equal(d, d.T)
    assert (np.diag(d) == 0).all() and (d >= 0).all()
    assert (d[~np.eye(30, dtype=bool)] > 0).all()


def test_rows_computed_per_client_assemble_to_the_central_matrix():
    rng = np.random.default_rng(1)
    lmat = rng.exponential(size=(12, 12))
    halves = np.stack([ld.half_row(lmat[i], i) for i in range(12)])   # each client alone
    np.testing.assert_allclose(ld.assemble(halves), ld.loss_distance(lmat))
    assert (np.diag(halves) == 0).all()


def test_eq6_on_the_hand_built_case():
    # d~(i,j) = |L_i(w_i) - L_j(w_i)| + |L_i(w_j) - L_j(w_j)|, same L as above:
    # (0,1): |1 - 4| + |3 - 2| = 4; (0,2): |1 - 0.5| + |1.5 - 1| = 1; (1,2): |2 - 7| + |2 - 1| = 6.
    lmat = np.array([[1.0, 3.0, 1.5],
                     [4.0, 2.0, 2.0],
                     [0.5, 7.0, 1.0]])
    np.testing.assert_allclose(ld.eq6_distance(lmat),
                               [[0, 4, 1], [4, 0, 6], [1, 6, 0]])


def test_triangle_inequality_can_fail():
    # Spec 9.1's counterexample: d(i,j) = d(j,k) = 0 but d(i,k) = 2.
    lmat = np.array([[0.0, 0.0, 1.0], [0.5, 0.5, 0.5], [1.0, 0.0, 0.0]])
    d = ld.loss_distance(lmat)
    assert d[0, 1] == 0 and d[1, 2] == 0 and d[0, 2] == 2


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 3))


def _permute_hidden(model: FlatModel, flat: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """The same function: hidden units reordered (rows of fc1 with columns of fc2)."""
    p = {k: v.clone() for k, v in model.unflatten(flat).items()}
    p["1.weight"], p["1.bias"] = p["1.weight"][perm], p["1.bias"][perm]
    p["3.weight"] = p["3.weight"][:, perm]
    return torch.cat([p[n].reshape(-1) for n in model.names])


def test_loss_distance_is_invariant_to_hidden_unit_permutation_diffnorm_is_not():
    """Spec 3.3: permuting w_j's hidden units leaves every L_i(w_j), hence d, unchanged."""
    model = FlatModel(_mlp())
    gen = torch.Generator().manual_seed(0)
    params = torch.randn(4, model.size, generator=gen) * 0.5
    data = [(torch.randn(25, 8, generator=gen), torch.randint(0, 3, (25,), generator=gen))
            for _ in range(4)]
    perm = torch.randperm(16, generator=gen)
    permuted = params.clone()
    permuted[2] = _permute_hidden(model, params[2], perm)

    def distance(stack: torch.Tensor) -> np.ndarray:
        rows = [ld.half_row(losses(model, stack, x, y), i) for i, (x, y) in enumerate(data)]
        return ld.assemble(np.stack(rows))

    np.testing.assert_allclose(distance(permuted), distance(params), rtol=1e-5, atol=1e-6)
    before = ld.diffnorm_distance(params.numpy())
    after = ld.diffnorm_distance(permuted.numpy())
    assert abs(after[2, 0] - before[2, 0]) > 0.1


def test_loss_distance_is_invariant_to_a_logit_shift_diffnorm_is_not():
    """Spec 3.3: adding c to every logit of w_j (its last-layer bias) leaves L_i(w_j) alone."""
    model = FlatModel(_mlp())
    gen = torch.Generator().manual_seed(1)
    params = torch.randn(3, model.size, generator=gen) * 0.5
    x, y = torch.randn(40, 8, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    shifted = params.clone()
    shifted[1, -3:] += 2.0   # "3.bias", the last 3 entries of the flat vector
    np.testing.assert_allclose(losses(model, shifted, x, y), losses(model, params, x, y),
                               rtol=1e-5)
    # ... while DiffNorm puts the same function c * sqrt(K) away from itself.
    same = ld.diffnorm_distance(torch.stack([params[1], shifted[1]]).numpy())[0, 1]
    assert same == pytest.approx(2.0 * np.sqrt(3), rel=1e-5)


def test_diffnorm_and_gradcos_against_direct_formulas():
    rng = np.random.default_rng(2)
    w = rng.normal(size=(7, 50)).astype(np.float32) + 100.0   # far from the origin
    direct = np.linalg.norm(w[:, None].astype(np.float64) - w[None], axis=2)
    np.testing.assert_allclose(ld.diffnorm_distance(w), direct, rtol=1e-4, atol=1e-3)
    g = rng.normal(size=(7, 50))
    g[3] = 0.0
    unit = g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300)
    expected = 1 - unit @ unit.T
    expected[3, :] = expected[:, 3] = 1.0
    np.fill_diagonal(expected, 0.0)
    np.testing.assert_allclose(ld.gradcos_distance(g), expected, atol=1e-6)


# ---------------------------------------------------------------- clustering on d


def brute_force_cost(d: np.ndarray, k: int) -> float:
    return min(pc.medoid_cost(d, np.array(m)) for m in itertools.combinations(range(len(d)), k))


def random_metric(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.normal(size=(n, 2))
    return np.linalg.norm(x[:, None] - x[None], axis=2)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_restarted_pam_reaches_the_brute_force_optimum_on_small_matrices(seed, k):
    rng = np.random.default_rng(seed)
    d = random_metric(rng, 8)
    found = pc.k_medoids(d, k, init="random", restarts=20, seed=seed)
    assert found.cost == pytest.approx(brute_force_cost(d, k), rel=1e-9)
    assert found.cost == pytest.approx(pc.medoid_cost(d, found.medoids))
    np.testing.assert_array_equal(found.labels, d[:, found.medoids].argmin(axis=1))


def test_build_and_swap_alone_is_mostly_optimal_and_never_below_the_optimum():
    # One BUILD + SWAP is a local search: a single swap cannot always reach the optimum.
    hits = 0
    for seed, k in itertools.product(range(12), [1, 2, 3]):
        d = random_metric(np.random.default_rng(seed), 8)
        cost, best = pc.k_medoids(d, k).cost, brute_force_cost(d, k)
        assert cost >= best - 1e-9
        hits += cost <= best + 1e-9
    assert hits >= 30   # of 36


@pytest.mark.parametrize("seed", range(6))
def test_pam_result_admits_no_improving_swap_on_larger_matrices(seed):
    rng = np.random.default_rng(100 + seed)
    d = random_metric(rng, 25)
    found = pc.k_medoids(d, 4)
    for p, o in itertools.product(range(4), range(25)):
        if o in found.medoids:
            continue
        trial = found.medoids.copy()
        trial[p] = o
        assert pc.medoid_cost(d, trial) >= found.cost - 1e-9


def planted(rng: np.random.Generator, sizes: list[int], within: float = 0.2,
            between: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A block-structured d: small distances inside blocks, large between (spec 8.2)."""
    truth = np.repeat(np.arange(len(sizes)), sizes)
    n = len(truth)
    noise = rng.uniform(0, within, size=(n, n))
    d = np.where(truth[:, None] == truth[None], noise, between + noise)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    perm = rng.permutation(n)
    return d[np.ix_(perm, perm)], truth[perm]


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(pc.first_appearance_labels(a), pc.first_appearance_labels(b))


@pytest.mark.parametrize("seed", range(3))
def test_every_method_recovers_planted_blocks(seed):
    rng = np.random.default_rng(seed)
    d, truth = planted(rng, [6, 9, 5, 8])
    assert same_partition(pc.k_medoids(d, 4).labels, truth)
    assert same_partition(pc.k_medoids(d, 4, method="alternate", init="random",
                                       restarts=10, seed=seed).labels, truth)
    for link in pc.LINKAGES:
        assert same_partition(pc.hierarchical(d, k=4, linkage_method=link), truth)
    assert same_partition(pc.hierarchical(d, threshold=0.6), truth)
    assert same_partition(pc.dbscan(d, eps=0.5, min_samples=3), truth)
    assert same_partition(pc.dbscan(d, min_samples=3), truth)   # eps from the fence


def test_silhouette_picks_the_planted_k():
    d, truth = planted(np.random.default_rng(5), [7, 7, 7])
    scores = {k: pc.silhouette(d, pc.k_medoids(d, k).labels) for k in range(2, 7)}
    assert max(scores, key=scores.get) == 3
    assert pc.silhouette(d, np.zeros(len(d), dtype=int)) == -1.0


def test_heuristic_init_can_start_inside_one_cluster():
    # A8: the k smallest row sums may all lie in one block; 'alternate' then may not escape,
    # PAM's SWAP does.
    d, truth = planted(np.random.default_rng(7), [12, 3])
    start = np.argsort(d.sum(axis=1), kind="stable")[:2]
    assert len(set(truth[start])) == 1
    assert same_partition(pc.k_medoids(d, 2, init="heuristic").labels, truth)


def test_dbscan_noise_rules():
    d, truth = planted(np.random.default_rng(3), [5, 5])
    n = len(d)
    far = np.full((n + 1, n + 1), 5.0)
    far[:n, :n] = d
    far[n, n] = 0.0
    far[n, :n] = far[:n, n] = 3.0 + np.arange(n) * 0.01   # nearest to point 0
    own = pc.dbscan(far, eps=0.5, min_samples=3, noise="singletons")
    assert len(np.unique(own)) == 3 and (own == own[n]).sum() == 1
    nearest = pc.dbscan(far, eps=0.5, min_samples=3, noise="nearest")
    assert nearest[n] == nearest[0] and len(np.unique(nearest)) == 2


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="square"):
        pc.k_medoids(np.zeros((2, 3)), 1)
    with pytest.raises(ValueError, match="k"):
        pc.k_medoids(np.zeros((3, 3)), 4)
    with pytest.raises(ValueError, match="exactly one"):
        pc.hierarchical(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="square"):
        ld.loss_distance(np.zeros((2, 3)))


# Three blobs of four points; point 8, (5.4, 4.7), is on average nearer the third blob (1.83
# against 2.44 to the second) but nearer the second blob's medoid (3.5, 5.0) than the third's
# (4.8, 6.6): 1.92 against 2.00. So k-medoids' optimum at k = 3 puts it in the second blob,
# whose weakest silhouette falls to 0.14; the average-linkage cut keeps the blobs (0.37).
BRIDGED = np.array([[1.5, 1.9], [1.7, 1.9], [2.1, 1.4], [2.5, 2.6],
                    [2.3, 5.1], [3.5, 5.0], [3.5, 3.7], [3.1, 5.9],
                    [5.4, 4.7], [5.2, 6.8], [4.8, 6.6], [4.7, 5.9]])
BLOBS = np.repeat(np.arange(3), 4)


def euclidean(points: np.ndarray) -> np.ndarray:
    return np.linalg.norm(points[:, None] - points[None], axis=2)


def test_kmedoids_optimum_misplaces_the_bridging_point_by_hand():
    d = euclidean(BRIDGED)
    assert d[8, 9:].mean() < d[8, 4:8].mean() and d[8, 5] < d[8, 10]
    best = min(itertools.combinations(range(12), 3), key=lambda m: pc.medoid_cost(d, list(m)))
    found = pc.k_medoids(d, 3)
    assert sorted(best) == found.medoids.tolist() == [1, 5, 10]
    assert found.labels[8] == found.labels[5] != found.labels[10]
    assert pc.weakest_silhouette(d, found.labels) < pc.NO_STRUCTURE
    tree = pc.hierarchical(d, k=3)
    assert same_partition(tree, BLOBS) and pc.weakest_silhouette(d, tree) > 0.35
    assert same_partition(pc.strongest(d, [found.labels, tree]), BLOBS)
    # A partition with a lone point counts only when every candidate has one.
    lone = np.array([0] * 11 + [1])
    assert same_partition(pc.strongest(d, [lone, found.labels]), found.labels)


def test_points_moved_by_hand():
    a = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    assert pc.points_moved(a, np.array([5, 5, 5, 3, 3, 3, 9, 9])) == 0   # names only
    assert pc.points_moved(a, np.array([0, 0, 1, 1, 1, 1, 2, 2])) == 1
    assert pc.points_moved(a, np.array([0, 1, 2, 0, 1, 2, 0, 1])) == 5   # 3 of 8 stay


def test_lcfl_automatic_k_sees_the_blobs_kmedoids_alone_merges():
    d = euclidean(BRIDGED)
    labels, info = LCFL().cluster_labels(d)
    assert same_partition(labels, BLOBS) and info["silhouettes"]["3"] > 0.35
    alone, _ = LCFL(tree_repair=None).cluster_labels(d)
    assert len(np.unique(alone)) == 2
    # k given is the paper's k-medoids, untouched.
    assert same_partition(LCFL(k_choice=ClusterCount(k=3)).cluster_labels(d)[0],
                          pc.k_medoids(d, 3).labels)


@pytest.mark.parametrize("seed", range(5))
def test_lcfl_automatic_k_keeps_one_cluster_without_structure(seed):
    rng = np.random.default_rng(seed)
    noise = np.abs(rng.normal(1.0, 0.2, (20, 20)))
    noise = (noise + noise.T) / 2
    np.fill_diagonal(noise, 0.0)
    for d in (noise, euclidean(rng.normal(size=(20, 10)))):
        assert (LCFL().cluster_labels(d)[0] == 0).all()


@pytest.mark.parametrize("seed", [18, 25, 31])
def test_a_tree_cut_far_from_kmedoids_is_no_evidence_of_clusters(seed):
    # One Gaussian cloud of 20 points in 5-D: the tree's cuts differ from k-medoids' in many
    # points and, taken freely, would split the cloud; as a repair of a few they are not taken.
    d = euclidean(np.random.default_rng(seed).normal(size=(20, 5)))
    assert (LCFL().cluster_labels(d)[0] == 0).all()
    assert (LCFL(tree_repair=None).cluster_labels(d)[0] == 0).all()
    assert len(np.unique(LCFL(tree_repair=1.0).cluster_labels(d)[0])) > 1
    with pytest.raises(ValueError, match="tree_repair"):
        LCFL(tree_repair=1.5)
