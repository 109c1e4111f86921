"""PACFL's mathematics: signatures, principal angles (Eqs. 2, 3), PME and HC with beta."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import subspace_angles

from clusterfed.algorithms.pacfl import principal_angles as pa
from clusterfed.client import signature
from clusterfed.clustering.metrics import clustering_scores
from clusterfed.clustering.precomputed import first_appearance_labels

pytestmark = pytest.mark.fast

E = np.eye(4)


def basis(*columns: np.ndarray) -> np.ndarray:
    return np.stack(columns, axis=1)


def random_orthonormal(rng: np.random.Generator, d: int, c: int) -> np.ndarray:
    return np.linalg.qr(rng.normal(size=(d, c)))[0]


def test_hand_worked_angles():
    # U = span{e1, e2}; W = span{e2, (e1 + e3)/sqrt 2}: principal angles 0 and 45 degrees.
    u = basis(E[0], E[1])
    w = basis(E[1], (E[0] + E[2]) / np.sqrt(2))
    a = {m: pa.proximity_block([u], [w], m)[0, 0] for m in pa.MEASURES}
    assert a["principal_min"] == pytest.approx(0.0, abs=1e-6)
    assert a["principal_sum"] == pytest.approx(45.0)
    assert a["min_pair"] == pytest.approx(0.0, abs=1e-6)          # e2 against e2
    assert a["ordered_sum"] == pytest.approx(90.0 + 90.0)        # <e1,e2> = <e2,w2> = 0
    # One vector at 30 degrees from e1 in the e1-e2 plane.
    v = basis(np.cos(np.radians(30)) * E[0] + np.sin(np.radians(30)) * E[1])
    for m in pa.MEASURES:
        assert pa.proximity_block([basis(E[0])], [v], m)[0, 0] == pytest.approx(30.0)
    # The min over basis pairs is not the smallest principal angle: e1 lies in span{w1, w2}
    # although it is 45 degrees from both basis vectors (spec 2.2).
    diag = basis((E[0] + E[1]) / np.sqrt(2), (E[0] - E[1]) / np.sqrt(2))
    assert pa.proximity_block([basis(E[0])], [diag], "min_pair")[0, 0] == pytest.approx(45.0)
    assert pa.proximity_block([basis(E[0])], [diag], "principal_min")[0, 0] == pytest.approx(
        0.0, abs=1e-6)


def test_principal_measures_match_scipy_subspace_angles():
    rng = np.random.default_rng(0)
    sigs = [random_orthonormal(rng, 12, c) for c in (1, 2, 3, 3, 4)]
    # A signature stacked from non-orthogonal blocks is orthonormalised first.
    sigs.append(np.hstack([random_orthonormal(rng, 12, 2), random_orthonormal(rng, 12, 2)]))
    low = pa.proximity_matrix(sigs, "principal_min")
    total = pa.proximity_matrix(sigs, "principal_sum")
    for i in range(len(sigs)):
        for j in range(len(sigs)):
            if i == j:
                continue
            angles = np.degrees(subspace_angles(sigs[i], sigs[j]))
            assert low[i, j] == pytest.approx(angles.min(), abs=1e-6)
            assert total[i, j] == pytest.approx(angles.sum(), abs=1e-6)
    assert np.all(pa.proximity_matrix(sigs, "min_pair") >= low - 1e-9)


@pytest.mark.parametrize("measure", ["min_pair", "principal_min", "principal_sum"])
def test_sign_flips_and_basis_order_do_not_change_the_correct_measures(measure):
    rng = np.random.default_rng(1)
    sigs = [random_orthonormal(rng, 20, 3) for _ in range(6)]
    base = pa.proximity_matrix(sigs, measure)
    flipped = [u * rng.choice([-1.0, 1.0], size=u.shape[1]) for u in sigs]
    shuffled = [u[:, rng.permutation(u.shape[1])] for u in flipped]
    np.testing.assert_allclose(pa.proximity_matrix(shuffled, measure), base, atol=1e-9)
    assert np.allclose(base, base.T) and np.all(np.diag(base) == 0)
    assert base.max() > 1.0


def test_ordered_sum_ignores_signs_but_follows_order_and_authors_variant_follows_signs():
    rng = np.random.default_rng(2)
    sigs = [random_orthonormal(rng, 20, 3) for _ in range(4)]
    base = pa.proximity_matrix(sigs, "ordered_sum")
    flipped = [-u for u in sigs[:2]] + sigs[2:]
    np.testing.assert_allclose(pa.proximity_matrix(flipped, "ordered_sum"), base, atol=1e-9)
    # Without |.| (the authors' code) a flipped pair reads near 180 - theta: the hazard.
    near = sigs[0] + 0.01 * rng.normal(size=sigs[0].shape)
    pair = [sigs[0], near]
    close = pa.proximity_matrix(pair, "min_pair", absolute=False)[0, 1]
    far = pa.proximity_matrix([sigs[0], -near], "min_pair", absolute=False)[0, 1]
    assert close < 5.0 < 60.0 < far
    with pytest.raises(ValueError, match="equal column counts"):
        pa.proximity_matrix([sigs[0], sigs[1][:, :2]], "ordered_sum")


def test_signature_blocks_are_orthonormal_and_invariant_to_scale_and_order():
    rng = np.random.default_rng(3)
    x = rng.random((60, 1, 5, 5)) ** 2
    y = np.repeat([0, 3, 7], 20)
    y[-18:] = 7
    y[40:42] = 9   # a class with 2 samples gives 2 columns, not p = 3
    u, labels = signature.client_signature(x, y, p=3)
    assert labels.tolist() == [0, 0, 0, 3, 3, 3, 7, 7, 7, 9, 9]
    for c in np.unique(labels):
        block = u[:, labels == c]
        np.testing.assert_allclose(block.T @ block, np.eye(block.shape[1]), atol=1e-9)
    order = rng.permutation(len(y))
    again, _ = signature.client_signature(3.7 * x[order], y[order], p=3)
    np.testing.assert_allclose(again, u, atol=1e-8)
    whole, whole_labels = signature.client_signature(x, y, p=4, per_class=False)
    assert whole.shape == (25, 4) and set(whole_labels.tolist()) == {-1}
    exact = signature.client_signature(x, y, p=3, svd="exact")[0]
    np.testing.assert_allclose(exact, u, atol=1e-7)
    # Per-channel normalisation shifts the data, which moves the subspace; centering does too.
    assert not np.allclose(signature.client_signature(x, y, mean=[0.5], std=[0.2])[0], u, atol=1e-3)
    centred, centred_labels = signature.client_signature(x, y, center=True)
    assert not np.allclose(centred[:, :3], u[:, :3], atol=1e-3)
    assert (centred_labels == 9).sum() == 1   # two centred samples span one direction


def groups_of_subspaces(rng: np.random.Generator, groups: int, per_group: int, d: int = 40
                        ) -> tuple[list[np.ndarray], np.ndarray]:
    """Each client's data: 80 samples near its group's random 3-D subspace, plus noise."""
    bases = [random_orthonormal(rng, d, 3) for _ in range(groups)]
    sigs, truth = [], []
    for g in range(groups):
        for _ in range(per_group):
            data = bases[g] @ rng.normal(size=(3, 80)) + 0.05 * rng.normal(size=(d, 80))
            sigs.append(signature.client_signature(data.T, p=3, per_class=False)[0])
            truth.append(g)
    return sigs, np.array(truth)


@pytest.mark.parametrize("measure", ["min_pair", "principal_min", "principal_sum"])
def test_clustering_recovers_groups_of_synthetic_subspaces(measure):
    rng = np.random.default_rng(4)
    sigs, truth = groups_of_subspaces(rng, groups=4, per_group=6)
    a = pa.proximity_matrix(sigs, measure)
    intra = a[truth[:, None] == truth[None]].max()
    inter = a[truth[:, None] != truth[None]].min()
    assert intra < inter
    labels = pa.hierarchical_clusters(a, beta=(intra + inter) / 2)
    assert clustering_scores(truth, labels)["ari"] == 1.0
    assert labels.tolist() == truth.tolist()   # canonical ids: by smallest member


def wpgma_by_hand(a: np.ndarray, beta: float) -> list[set[int]]:
    """The authors' loop (spec 2.3): merge the closest pair while its distance <= beta,
    the merged row the plain mean of the two rows (WPGMA)."""
    a = a.astype(float).copy()
    groups = [{i} for i in range(len(a))]
    while len(groups) > 1:
        masked = a + np.diag(np.full(len(a), np.inf))
        i, j = np.unravel_index(np.argmin(masked), masked.shape)
        if masked[i, j] > beta:
            break
        i, j = min(i, j), max(i, j)
        row = (a[i] + a[j]) / 2
        a[i], a[:, i] = row, row
        a[i, i] = 0
        a = np.delete(np.delete(a, j, 0), j, 1)
        groups[i] |= groups.pop(j)
    return groups


def test_weighted_linkage_cut_at_beta_is_the_authors_merge_loop():
    rng = np.random.default_rng(5)
    for trial in range(20):
        points = rng.normal(size=(12, 3))
        a = np.linalg.norm(points[:, None] - points[None], axis=-1) * 10
        beta = float(rng.uniform(5, 25))
        labels = pa.hierarchical_clusters(a, beta, "weighted")
        found = {frozenset(np.flatnonzero(labels == k).tolist()) for k in np.unique(labels)}
        assert found == {frozenset(g) for g in wpgma_by_hand(a, beta)}, trial


def test_beta_extremes_and_monotone_cluster_counts():
    rng = np.random.default_rng(6)
    sigs, _ = groups_of_subspaces(rng, groups=3, per_group=4)
    a = pa.proximity_matrix(sigs)
    off = a[~np.eye(len(a), dtype=bool)]
    assert len(np.unique(pa.hierarchical_clusters(a, off.max()))) == 1
    assert len(np.unique(pa.hierarchical_clusters(a, off.min() / 2))) == len(a)
    assert len(np.unique(pa.hierarchical_clusters(a, n_clusters=3))) == 3
    betas = np.linspace(0, off.max(), 30)
    counts = pa.clusters_against_beta(pa.linkage_tree(a), len(a), betas)
    assert counts[0] == len(a) and counts[-1] == 1 and np.all(np.diff(counts) <= 0)


@pytest.mark.parametrize("measure", ["min_pair", "principal_min", "principal_sum"])
def test_newcomer_extension_equals_recomputing_the_whole_matrix(measure):
    rng = np.random.default_rng(7)
    sigs = [random_orthonormal(rng, 15, int(c)) for c in rng.integers(1, 4, size=9)]
    old = pa.proximity_matrix(sigs[:6], measure)
    extended = pa.extend_proximity(old, sigs[:6], sigs[6:], measure)
    np.testing.assert_allclose(extended, pa.proximity_matrix(sigs, measure), atol=1e-9)
    np.testing.assert_array_equal(extended[:6, :6], old)


def test_chunked_gram_matches_one_block(monkeypatch):
    rng = np.random.default_rng(8)
    sigs = [random_orthonormal(rng, 30, 3) for _ in range(10)]
    whole = pa.proximity_matrix(sigs)
    monkeypatch.setattr(pa, "CHUNK_COLUMNS", 7)   # two signatures per chunk
    np.testing.assert_allclose(pa.proximity_matrix(sigs), whole, atol=1e-12)


def test_match_clusters_maps_each_new_cluster_to_the_majority_old_one():
    previous = np.array([0, 0, 0, 1, 1, -1, -1])
    current = np.array([0, 0, 1, 1, 1, 1, 2])
    assert pa.match_clusters(previous, current).tolist() == [0, 1, -1]
    assert first_appearance_labels(np.array([5, 5, 2, 9, 2])).tolist() == [0, 0, 1, 2, 1]
