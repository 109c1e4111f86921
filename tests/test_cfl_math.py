"""CFL clustering mathematics against loops, brute force, hand values and the separation theorem."""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics.pairwise import cosine_similarity

from clusterfed.algorithms.aggregate import weighted_mean
from clusterfed.algorithms.cfl.maths import (
    cross_similarity_bound,
    gamma_max,
    map_to_clients,
    max_norm_stagnates,
    max_update_norm,
    mean_update_norm,
    noise_coupling,
    norm_split_test,
    scale_free_split_test,
    split_is_admissible,
    update_norms,
)
from clusterfed.clustering.bipartition import (
    alpha_cross_max,
    complete_linkage_bipartition,
    intra_similarity_min,
    optimal_bipartition,
    optimal_bipartition_alg1,
    separation_gap,
)
from clusterfed.clustering.metrics import clustering_scores
from clusterfed.clustering.similarity import (
    cosine_from_gram,
    cosine_similarity_matrix,
    gram_matrix,
    gram_rows,
    update_gram,
)

pytestmark = pytest.mark.fast

# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def random_similarity(rng: np.random.Generator, m: int) -> np.ndarray:
    a = rng.uniform(-1.0, 1.0, (m, m))
    s = (a + a.T) / 2.0
    np.fill_diagonal(s, 1.0)
    return s


def tied_similarity(rng: np.random.Generator, m: int) -> np.ndarray:
    """Entries from five values only: many ties."""
    a = rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], size=(m, m))
    s = np.triu(a, 1)
    s = s + s.T
    np.fill_diagonal(s, 1.0)
    return s


def brute_force_optimum(s: np.ndarray) -> float:
    """min over all 2^(m-1) - 1 bipartitions of the max cross similarity (Eq. 25)."""
    m = len(s)
    best = np.inf
    for mask in range(1, 2 ** (m - 1)):  # position m - 1 always in the second part
        first = np.array([(mask >> i) & 1 == 1 for i in range(m)])
        best = min(best, s[np.ix_(first, ~first)].max())
    return float(best)


def assert_bipartition(parts: tuple[np.ndarray, np.ndarray], m: int) -> None:
    a, b = parts
    assert len(a) > 0 and len(b) > 0
    assert np.array_equal(a, np.sort(a)) and np.array_equal(b, np.sort(b))
    assert np.array_equal(np.sort(np.concatenate([a, b])), np.arange(m))
    assert a[0] == 0  # the part holding position 0 comes first


def same_parts(p: tuple[np.ndarray, np.ndarray], q: tuple[np.ndarray, np.ndarray]) -> bool:
    return np.array_equal(p[0], q[0]) and np.array_equal(p[1], q[1])


def is_correct(parts: tuple[np.ndarray, np.ndarray], labels: np.ndarray) -> bool:
    """Def. 1: no distribution has clients on both sides."""
    return not set(labels[parts[0]]) & set(labels[parts[1]])


# ------------------------------------------------------------------------------------------
# cosine similarities
# ------------------------------------------------------------------------------------------


def naive_cosine(u: np.ndarray) -> np.ndarray:
    u = u.astype(np.float64)
    m = len(u)
    out = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            ni, nj = np.linalg.norm(u[i]), np.linalg.norm(u[j])
            out[i, j] = 0.0 if ni == 0 or nj == 0 else float(u[i] @ u[j]) / (ni * nj)
    return out


def test_cosine_matches_loop_and_sklearn_with_a_zero_row():
    rng = np.random.default_rng(0)
    u = rng.normal(size=(7, 50)).astype(np.float32)
    u[3] = 0.0
    s = cosine_similarity_matrix(u)
    np.testing.assert_allclose(s, naive_cosine(u), atol=1e-12)
    np.testing.assert_allclose(s, cosine_similarity(u.astype(np.float64)), atol=1e-12)
    assert s.dtype == np.float64
    assert np.array_equal(s, s.T)  # symmetric bit for bit
    assert np.all(s[3] == 0.0) and np.all(s[:, 3] == 0.0)  # zero row: cosine 0, diagonal too
    assert np.array_equal(np.diag(s), [1, 1, 1, 0, 1, 1, 1])
    assert np.all(np.abs(s) <= 1.0)


def test_cosine_chunked_equals_unchunked_and_gram():
    rng = np.random.default_rng(1)
    u = rng.normal(size=(9, 1001)).astype(np.float32)
    whole = cosine_similarity_matrix(u, chunk_size=10**6)
    for chunk in (1, 7, 100, 1000, 1001):
        np.testing.assert_allclose(cosine_similarity_matrix(u, chunk_size=chunk), whole,
                                   rtol=0, atol=1e-13)
    u64 = u.astype(np.float64)
    np.testing.assert_allclose(gram_matrix(u, chunk_size=13), u64 @ u64.T, rtol=1e-12)
    # float64 and integer input too
    np.testing.assert_allclose(cosine_similarity_matrix(u64, chunk_size=64), whole, atol=1e-13)
    ints = np.array([[1, 0], [0, 2], [3, 3]])
    np.testing.assert_allclose(cosine_similarity_matrix(ints)[2, :2], [2**-0.5, 2**-0.5])


def test_updating_changed_rows_equals_the_whole_gram_matrix():
    rng = np.random.default_rng(4)
    u = rng.normal(size=(11, 301)).astype(np.float32)
    gram = gram_matrix(u)
    u64 = u.astype(np.float64)
    np.testing.assert_allclose(gram_rows(u, np.array([3, 0]), chunk_size=17),
                               (u64 @ u64.T)[[3, 0]], rtol=1e-12)
    changed = np.array([7, 2, 9, 2])                 # unsorted, repeated
    v = u.copy()
    v[[2, 7, 9]] = rng.normal(size=(3, 301))
    v[9] = 0.0                                       # a zero row keeps the cosine's rule
    kept = gram.copy()
    new = update_gram(gram, v, changed, chunk_size=50)
    np.testing.assert_array_equal(gram, kept)        # the old matrix is left as it was
    np.testing.assert_array_equal(new, new.T)        # exactly symmetric
    np.testing.assert_allclose(new, gram_matrix(v), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(cosine_from_gram(new), cosine_similarity_matrix(v), atol=1e-12)
    # The rows not named keep the old matrix's values: only the changed ones are recomputed.
    stale = update_gram(gram, v, np.array([2]))
    np.testing.assert_array_equal(stale[7, 8], gram[7, 8])
    assert not np.allclose(stale, gram_matrix(v))


def test_cosine_is_scale_free_and_permutation_invariant():
    rng = np.random.default_rng(2)
    u = rng.normal(size=(5, 40))
    s = cosine_similarity_matrix(u)
    scaled = u * rng.uniform(0.1, 10.0, size=(5, 1))
    np.testing.assert_allclose(cosine_similarity_matrix(scaled), s, atol=1e-13)
    perm = rng.permutation(40)  # the privacy transform P of Section V-B (Eq. 45)
    np.testing.assert_allclose(cosine_similarity_matrix(u[:, perm]), s, atol=1e-13)


def test_cosine_never_copies_the_whole_matrix_to_float64():
    u = np.ones((20, 200_000), dtype=np.float32)  # 16 MB; a float64 copy would be 32 MB
    u[:, ::2] = -1.0
    tracemalloc.start()
    try:
        s = cosine_similarity_matrix(u, chunk_size=5_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak  # blocks of 20 x 5000 float64 = 0.8 MB
    np.testing.assert_allclose(s, np.ones((20, 20)), atol=1e-12)


def test_cosine_rejects_bad_input():
    with pytest.raises(ValueError):
        cosine_similarity_matrix(np.ones(4))
    with pytest.raises(ValueError):
        cosine_similarity_matrix(np.array([[1.0, np.nan], [0.0, 1.0]]))
    with pytest.raises(ValueError):
        cosine_similarity_matrix(np.ones((2, 3)), chunk_size=0)


# ------------------------------------------------------------------------------------------
# Algorithm 1 and its maximum-spanning-tree form against brute force
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", range(2, 11))
def test_bipartitions_reach_the_brute_force_optimum(m):
    rng = np.random.default_rng(100 + m)
    matrices = [random_similarity(rng, m) for _ in range(4)]
    matrices += [tied_similarity(rng, m) for _ in range(4)]
    matrices += [cosine_similarity_matrix(rng.normal(size=(m, 3))) for _ in range(2)]
    for s in matrices:
        optimum = brute_force_optimum(s)
        fast = optimal_bipartition(s)
        literal = optimal_bipartition_alg1(s)
        for parts in (fast, literal):
            assert_bipartition(parts, m)
            assert alpha_cross_max(s, *parts) == optimum
        assert same_parts(fast, literal)  # identical, ties included


def test_mst_form_equals_algorithm_1_and_scipy_single_linkage_on_larger_matrices():
    rng = np.random.default_rng(7)
    for m in (15, 30, 60):
        for make in (random_similarity, tied_similarity):
            s = make(rng, m)
            fast = optimal_bipartition(s)
            assert same_parts(fast, optimal_bipartition_alg1(s))
        s = random_similarity(rng, m)  # no ties: scipy's single linkage must agree
        labels = fcluster(linkage(squareform(1.0 - s, checks=False), "single"), 2, "maxclust")
        assert set(np.flatnonzero(labels == labels[0])) == set(optimal_bipartition(s)[0])


def test_bipartition_tie_breaking_by_hand():
    # All cross similarities equal: Algorithm 1 merges pairs in flat-index order, (0,1), (0,2),
    # ..., so the last client stays alone.
    s = np.zeros((4, 4))
    np.fill_diagonal(s, 1.0)
    for f in (optimal_bipartition, optimal_bipartition_alg1):
        a, b = f(s)
        assert list(a) == [0, 1, 2] and list(b) == [3]
    # Two clients: the only bipartition, whatever the values (also a zero diagonal).
    for f in (optimal_bipartition, optimal_bipartition_alg1):
        a, b = f(np.array([[0.0, 0.9], [0.9, 0.0]]))
        assert list(a) == [0] and list(b) == [1]


def test_bipartition_uses_the_upper_triangle_and_validates():
    s = np.array([[1.0, 0.9, -0.5], [0.9, 1.0, -0.4], [-0.5, -0.4, 1.0]])
    nudged = s.copy()
    nudged[1, 0] += 1e-12  # rounding-level asymmetry is tolerated
    assert same_parts(optimal_bipartition(nudged), optimal_bipartition(s))
    a, b = optimal_bipartition(s)
    assert list(a) == [0, 1] and list(b) == [2]
    for bad in (np.ones((1, 1)), np.ones((2, 3)), np.array([[1.0, 0.5], [0.1, 1.0]]),
                np.array([[1.0, np.inf], [np.inf, 1.0]])):
        for f in (optimal_bipartition, optimal_bipartition_alg1, complete_linkage_bipartition):
            with pytest.raises(ValueError):
                f(bad)


# ------------------------------------------------------------------------------------------
# complete linkage (the authors' code)
# ------------------------------------------------------------------------------------------


def block_similarity(rng: np.random.Generator, sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    labels = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(labels)
    m = len(labels)
    s = rng.uniform(-0.3, 0.2, (m, m))  # across blocks
    same = labels[:, None] == labels[None, :]
    s[same] = rng.uniform(0.6, 1.0, same.sum())  # within blocks
    s = np.triu(s, 1)
    s = s + s.T
    np.fill_diagonal(s, 1.0)
    return s, labels


def test_complete_linkage_valid_and_equal_to_sklearn():
    rng = np.random.default_rng(3)
    for m in range(2, 16):
        s = random_similarity(rng, m)
        parts = complete_linkage_bipartition(s)
        assert_bipartition(parts, m)
        if m > 2:
            model = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
            labels = model.fit(-s).labels_
            assert set(np.flatnonzero(labels == labels[0])) == set(parts[0])
    s = tied_similarity(rng, 9)
    assert same_parts(complete_linkage_bipartition(s), complete_linkage_bipartition(s.copy()))


def test_complete_linkage_finds_the_optimum_on_separated_blocks_but_not_always():
    rng = np.random.default_rng(4)
    # Two well-separated blocks (every intra value above every cross value): both methods
    # return the blocks, and so the optimum.
    for sizes in ([1, 2], [3, 4], [5, 2], [6, 6], [10, 7]):
        for _ in range(3):
            s, labels = block_similarity(rng, sizes)
            optimal = optimal_bipartition(s)
            if len(s) <= 10:
                assert alpha_cross_max(s, *optimal) == brute_force_optimum(s)
            assert same_parts(complete_linkage_bipartition(s), optimal)
            assert set(labels[optimal[0]]) == {labels[0]}
    # More blocks: complete linkage still cuts between blocks (a correct split, Def. 1), but
    # the blocks it groups need not be those of the min-max optimum.
    for sizes in ([2, 5, 3], [4, 4, 4, 4], [3, 3, 3]):
        for _ in range(3):
            s, labels = block_similarity(rng, sizes)
            parts = complete_linkage_bipartition(s)
            assert is_correct(parts, labels) and is_correct(optimal_bipartition(s), labels)
            assert alpha_cross_max(s, *parts) >= alpha_cross_max(s, *optimal_bipartition(s))
    # On unstructured matrices complete linkage is often worse than Algorithm 1 (spec §2.1).
    worse = 0
    for _ in range(30):
        s = random_similarity(rng, 8)
        cl = alpha_cross_max(s, *complete_linkage_bipartition(s))
        opt = alpha_cross_max(s, *optimal_bipartition(s))
        assert cl >= opt
        worse += cl > opt
    assert worse > 0


# ------------------------------------------------------------------------------------------
# alpha_cross^max, gamma_max and the separation gap by hand
# ------------------------------------------------------------------------------------------


HAND = np.array([
    [1.0, 0.8, 0.7, -0.2, 0.1],
    [0.8, 1.0, 0.9, 0.3, -0.4],
    [0.7, 0.9, 1.0, 0.0, -0.1],
    [-0.2, 0.3, 0.0, 1.0, 0.6],
    [0.1, -0.4, -0.1, 0.6, 1.0],
])


def test_alpha_cross_max_and_gap_by_hand():
    a, b = optimal_bipartition(HAND)
    assert list(a) == [0, 1, 2] and list(b) == [3, 4]
    # cross block [[-0.2, 0.1], [0.3, -0.4], [0.0, -0.1]]: max 0.3
    assert alpha_cross_max(HAND, a, b) == pytest.approx(0.3)
    assert alpha_cross_max(HAND, [0], [1, 2, 3, 4]) == pytest.approx(0.8)
    labels = np.array([0, 0, 0, 1, 1])
    # intra pairs: 0.8, 0.7, 0.9 and 0.6 -> min 0.6; g = 0.6 - 0.3
    assert intra_similarity_min(HAND, labels) == pytest.approx(0.6)
    assert separation_gap(HAND, labels) == pytest.approx(0.3)
    # A labelling that splits {0, 1, 2}: the cross term does not change, the intra one does.
    assert separation_gap(HAND, np.array([0, 1, 1, 0, 0])) == pytest.approx(-0.2 - 0.3)
    # No distribution with two clients: alpha_intra^min := 1 (spec A19).
    assert separation_gap(HAND, np.arange(5)) == pytest.approx(1.0 - 0.3)
    with pytest.raises(ValueError):
        alpha_cross_max(HAND, [0, 1], [1, 2])
    with pytest.raises(ValueError):
        alpha_cross_max(HAND, [], [1, 2])


def test_gamma_max_by_hand():
    assert gamma_max(-1.0) == 1.0
    assert gamma_max(0.0) == pytest.approx(np.sqrt(0.5))
    assert gamma_max(0.5) == pytest.approx(0.5)
    assert gamma_max(0.98) == pytest.approx(0.1)
    assert gamma_max(1.0) == 0.0
    assert gamma_max(1.0 + 1e-15) == 0.0  # rounding above 1: 0, not NaN
    # gamma_max < sqrt((1 - alpha) / 2), strictly; equivalently alpha < 1 - 2 gamma_max^2
    assert split_is_admissible(0.5, 0.49) and not split_is_admissible(0.5, 0.5)
    assert split_is_admissible(0.97, 0.1) and not split_is_admissible(0.99, 0.1)
    assert split_is_admissible(-1.0, 0.99)
    assert split_is_admissible(0.999, 0.0) and not split_is_admissible(1.0, 0.0)
    with pytest.raises(ValueError):
        split_is_admissible(0.0, 1.5)


def test_noise_coupling_and_cross_bound_by_hand():
    assert noise_coupling(0.0, 0.0) == pytest.approx(1.0)
    assert noise_coupling(0.6, 0.6) == pytest.approx(-0.36 + 0.64)  # = 1 - 2 * 0.36
    g = np.linspace(0.0, 0.99, 12)
    gi, gj = np.meshgrid(g, g)
    np.testing.assert_allclose(noise_coupling(gi, gj), np.cos(np.arcsin(gi) + np.arcsin(gj)),
                               atol=1e-12)
    assert np.all(noise_coupling(gi, gj) >= 1 - 2 * np.maximum(gi, gj) ** 2 - 1e-12)  # Eq. 38
    assert cross_similarity_bound(1.0, 2) == pytest.approx(-1.0)  # exact case, Eq. 13
    assert cross_similarity_bound(0.5, 2) == pytest.approx(-0.5)  # Remark 1: -H
    assert cross_similarity_bound(1.0, 3) == pytest.approx(0.0, abs=1e-12)  # cos(pi/2)
    assert cross_similarity_bound(1.0, 4) == pytest.approx(0.5)  # cos(pi/3)
    assert cross_similarity_bound(0.4, 4) == 1.0  # H below cos(pi/3): no bound


# ------------------------------------------------------------------------------------------
# the separation theorem on synthetic gradients (spec §3.3, §3.4, §3.8)
# ------------------------------------------------------------------------------------------


def synthetic_gradients(rng: np.random.Generator, k: int, d: int, per_cluster: int,
                        gammas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """grad r_i = v_I(i) + X_i with sum_l a_l v_l = 0 and ||X_i|| = gamma_i ||v_I(i)||."""
    labels = np.repeat(np.arange(k), per_cluster)
    sizes = rng.integers(50, 500, len(labels))
    a = np.bincount(labels, weights=sizes) / sizes.sum()
    v = rng.normal(size=(k, d))
    v -= a @ v  # the mixture of true gradients vanishes: a stationary point (Eq. 104)
    assert np.allclose(a @ v, 0.0)
    noise = rng.normal(size=(len(labels), d))
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    noise *= (gammas * np.linalg.norm(v[labels], axis=1))[:, None]
    return v[labels] + noise, labels


def test_exact_two_distributions_give_plus_minus_one():
    rng = np.random.default_rng(5)
    v1 = rng.normal(size=30)
    grads = np.stack([v1, v1, -0.5 * v1, v1, -0.5 * v1])  # v2 = -(a1/a2) v1 with a1/a2 = 1/2
    labels = np.array([0, 0, 1, 0, 1])
    s = cosine_similarity_matrix(grads)
    np.testing.assert_allclose(np.abs(s), 1.0, atol=1e-12)
    parts = optimal_bipartition(s)
    assert list(parts[0]) == [0, 1, 3] and list(parts[1]) == [2, 4]
    assert alpha_cross_max(s, *parts) == pytest.approx(-1.0)
    assert separation_gap(s, labels) == pytest.approx(2.0)
    assert gamma_max(alpha_cross_max(s, *parts)) == pytest.approx(1.0)


def test_theorem_1_bounds_hold_on_synthetic_gradients():
    """Spec §3.8 item 7: alpha_ij >= H_ij within a distribution (Lemma 2, Eq. 21) and
    alpha_cross^max <= cos(pi/(k-1) - arccos H_min), or 1 (Eq. 19), for gamma_i <= 0.6."""
    rng = np.random.default_rng(6)
    for k, d in itertools.product(range(2, 7), (2, 3, 5, 20)):
        for _ in range(8):
            gammas = rng.uniform(0.0, 0.6, 3 * k)
            grads, labels = synthetic_gradients(rng, k, d, 3, gammas)
            s = cosine_similarity_matrix(grads)
            h = noise_coupling(gammas[:, None], gammas[None, :])
            same = labels[:, None] == labels[None, :]
            assert np.all(s[same] >= h[same] - 1e-9)
            cross = alpha_cross_max(s, *optimal_bipartition(s))
            assert cross <= cross_similarity_bound(h.min(), k) + 1e-9


def test_inside_the_guaranteed_region_the_split_is_correct_and_accepted():
    """gamma_i < sin(pi/(4(k-1))) (spec §3.4): g > 0, Algorithm 1's split separates the true
    clusters (Corollary 1) and passes Eq. 39 with gamma_max = max_i gamma_i."""
    rng = np.random.default_rng(8)
    for k in range(2, 7):
        limit = np.sin(np.pi / (4 * (k - 1)))
        for d in (2, 10, 50):
            for _ in range(6):
                gammas = rng.uniform(0.0, 0.95 * limit, 3 * k)
                grads, labels = synthetic_gradients(rng, k, d, 3, gammas)
                s = cosine_similarity_matrix(grads)
                parts = optimal_bipartition(s)
                cross = alpha_cross_max(s, *parts)
                assert intra_similarity_min(s, labels) >= 1 - 2 * gammas.max() ** 2 - 1e-9
                assert separation_gap(s, labels) > 0
                assert is_correct(parts, labels)
                assert split_is_admissible(cross, float(gammas.max()))
                assert not split_is_admissible(cross, gamma_max(cross))


def test_positive_gap_implies_a_correct_split_even_with_large_noise():
    """Corollary 1 (spec §3.8 item 9), in the Fig. 3 setting (d = 100, m = 3k, gamma up to 2)."""
    rng = np.random.default_rng(9)
    positive = 0
    for k in (2, 3, 5, 10):
        for gamma in (0.5, 1.0, 1.5, 2.0):
            for _ in range(4):
                grads, labels = synthetic_gradients(rng, k, 100, 3, np.full(3 * k, gamma))
                s = cosine_similarity_matrix(grads)
                if separation_gap(s, labels) > 0:
                    positive += 1
                    assert is_correct(optimal_bipartition(s), labels)
    assert positive > 20  # the check is not vacuous


def test_one_distribution_never_has_a_positive_gap():
    """Spec §3.8 item 8: in a pure cluster max cross >= min intra."""
    rng = np.random.default_rng(10)
    for _ in range(20):
        grads = rng.normal(size=30) + 0.5 * rng.normal(size=(6, 30))
        assert separation_gap(cosine_similarity_matrix(grads), np.zeros(6, int)) <= 0


# ------------------------------------------------------------------------------------------
# second-level splits: positions in a sub-matrix -> client ids
# ------------------------------------------------------------------------------------------


def three_cluster_toy() -> tuple[np.ndarray, np.ndarray]:
    """A is opposite to both B and C; B and C are orthogonal. Interleaved client ids."""
    rng = np.random.default_rng(11)
    labels = np.array([0, 1, 2, 0, 2, 1, 0, 2, 1])  # A = {0, 3, 6}, B = {1, 5, 8}, C = {2, 4, 7}
    directions = np.zeros((3, 20))
    directions[0, 0] = -1.0
    directions[1, :2] = [1.0, 1.0]
    directions[2, :2] = [1.0, -1.0]
    updates = directions[labels] + 0.05 * rng.normal(size=(9, 20))
    return updates, labels


def test_second_level_split_maps_positions_back_to_client_ids():
    updates, labels = three_cluster_toy()
    s = cosine_similarity_matrix(updates)
    root = np.arange(9)
    first = [map_to_clients(root, p) for p in optimal_bipartition(s)]
    assert [list(c) for c in first] == [[0, 3, 6], [1, 2, 4, 5, 7, 8]]  # {A} | {B, C}

    members = first[1]  # ids 1, 2, 4, 5, 7, 8: not from 0, not contiguous
    positions = optimal_bipartition(s[np.ix_(members, members)])
    assert [list(p) for p in positions] == [[0, 3, 5], [1, 2, 4]]
    second = [map_to_clients(members, p) for p in positions]
    assert [list(c) for c in second] == [[1, 5, 8], [2, 4, 7]]  # B | C
    # The authors' notebook stored the positions themselves as client ids: wrong clients.
    assert set(positions[0]) != set(second[0]) and {0, 3} <= set(positions[0])
    assert set(labels[positions[0]]) == {0, 1}  # "B" would hold two clients of A

    found = np.empty(9, int)
    for cluster, ids in enumerate([first[0], *second]):
        found[ids] = cluster
    assert clustering_scores(labels, found)["ari"] == 1.0


def test_map_to_clients_validates():
    ids = np.array([4, 9, 2])
    assert list(map_to_clients(ids, np.array([2, 0]))) == [2, 4]
    assert map_to_clients(ids, np.array([], dtype=int)).size == 0
    for bad in (np.array([3]), np.array([-1]), np.array([0.0, 1.0]), np.array([[0]])):
        with pytest.raises(ValueError):
            map_to_clients(ids, bad)


# ------------------------------------------------------------------------------------------
# update norms and the split criteria
# ------------------------------------------------------------------------------------------


def test_update_norms_by_hand_and_chunked():
    u = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [1.0, 2.0, 2.0]], dtype=np.float32)
    np.testing.assert_allclose(update_norms(u, chunk_size=1), [5.0, 0.0, 3.0])
    assert max_update_norm(u) == pytest.approx(5.0)
    # uniform mean [4/3, 2, 2/3]; weighted 1:0:1 mean [2, 3, 1]
    assert mean_update_norm(u) == pytest.approx(np.sqrt(16 / 9 + 4 + 4 / 9))
    assert mean_update_norm(u, np.array([1, 0, 1]), chunk_size=2) == pytest.approx(np.sqrt(14))
    assert mean_update_norm(u, np.array([10, 0, 10])) == mean_update_norm(u, np.array([1, 0, 1]))
    for bad in (np.array([1, 1]), np.array([0, 0, 0]), np.array([1, -1, 1])):
        with pytest.raises(ValueError):
            mean_update_norm(u, bad)


def test_mean_update_norm_weights_like_fedavg():
    rng = np.random.default_rng(12)
    u = rng.normal(size=(6, 301)).astype(np.float32)
    samples = rng.integers(1, 100, 6)
    for weights in (samples, np.ones(6)):
        expected = np.linalg.norm(weighted_mean(u, weights).astype(np.float64))
        assert mean_update_norm(u, weights, chunk_size=37) == pytest.approx(expected, rel=1e-6)
    assert mean_update_norm(u, None) == pytest.approx(mean_update_norm(u, np.ones(6)))


def test_norm_split_test_is_strict():
    assert norm_split_test(0.3, 2.0, eps1=0.4, eps2=1.6)
    assert not norm_split_test(0.4, 2.0, eps1=0.4, eps2=1.6)
    assert not norm_split_test(0.3, 1.6, eps1=0.4, eps2=1.6)
    with pytest.raises(ValueError):
        norm_split_test(0.3, 2.0, eps1=0.0, eps2=1.6)


def test_scale_free_rule():
    incongruent = [3.0, 2.5, 2.2, 2.1, 2.1, 2.15, 2.2]  # the max norm stagnates (Fig. 7)
    congruent = [3.0, 2.4, 1.9, 1.5, 1.2, 0.9, 0.7]  # it keeps falling with the mean norm
    assert max_norm_stagnates(incongruent, window=3)
    assert not max_norm_stagnates(congruent, window=3)
    assert not max_norm_stagnates(incongruent[:3], window=3)  # too short to tell
    assert scale_free_split_test(0.3, incongruent, ratio=0.25, window=3)
    assert not scale_free_split_test(0.6, incongruent, ratio=0.25, window=3)  # 0.6 / 2.2 > 0.25
    assert not scale_free_split_test(0.1, congruent, ratio=0.25, window=3)
    assert not scale_free_split_test(0.0, [0.0] * 10)
    # Scale-free: multiplying every norm by the same factor changes nothing.
    scaled = [100 * h for h in incongruent]
    assert scale_free_split_test(30.0, scaled, window=3)
    with pytest.raises(ValueError):
        max_norm_stagnates(incongruent, window=0)
