"""Hierarchical clustering of client vectors: distances against brute force, known groups."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from clusterfed.clustering import hierarchical as hc
from clusterfed.clustering.precomputed import first_appearance_labels

pytestmark = pytest.mark.fast

PAIRINGS = [(m, k) for m in hc.METRICS for k in hc.LINKAGES if k != "ward" or m == "l2"]


def groups_of_vectors(sizes=(5, 3, 6), d=40, noise=0.05, seed=0):
    """Rows in known groups: random near-orthogonal centres, each row its centre plus noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(sizes), d))
    truth = np.repeat(np.arange(len(sizes)), sizes)
    vectors = centres[truth] * rng.uniform(0.97, 1.03, size=(len(truth), 1)) \
        + noise * rng.normal(size=(len(truth), d))
    return vectors.astype(np.float32), truth


@pytest.mark.parametrize("metric", hc.METRICS)
def test_distances_match_brute_force_in_any_number_of_column_blocks(metric):
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(7, 301)).astype(np.float32)
    vectors[3] = 0.0   # a zero vector: cosine distance 1 to every other vector
    name = {"l1": "cityblock", "l2": "euclidean", "cosine": "cosine"}[metric]
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = cdist(vectors.astype(np.float64), vectors.astype(np.float64), name)
    if metric == "cosine":
        expected[3, :] = expected[:, 3] = 1.0
        np.fill_diagonal(expected, 0.0)
    for chunk_size in (None, 13):   # one block; 24 blocks of 13 columns
        got = hc.pairwise_distances(vectors, metric, chunk_size=chunk_size)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
        assert np.array_equal(got, got.T) and np.all(np.diag(got) == 0)


@pytest.mark.parametrize(("metric", "linkage"), PAIRINGS)
def test_known_groups_are_recovered_for_every_metric_and_linkage(metric, linkage):
    vectors, truth = groups_of_vectors()
    by_count = hc.hierarchical_clusters(vectors, metric, linkage, 3, mode="clusters")
    np.testing.assert_array_equal(by_count.labels, truth)
    # An absolute tau between the within-group and the between-group merge heights.
    heights = np.sort(by_count.heights)   # the top two merges join the three groups
    assert heights[-2] > 2 * heights[-3]   # the groups stand apart in the tree
    tau = (heights[-2] + heights[-3]) / 2
    cut = hc.hierarchical_clusters(vectors, metric, linkage, tau)
    np.testing.assert_array_equal(cut.labels, truth)
    assert cut.threshold == tau and cut.num_clusters == 3
    assert cut.linkage.shape == (len(truth) - 1, 4)
    assert np.all(np.diff(cut.heights) >= -1e-12)   # monotone merge heights
    # The same tau as a fraction of the largest merge height gives the same clusters.
    relative = hc.hierarchical_clusters(vectors, metric, linkage, tau / heights[-1],
                                        mode="relative")
    np.testing.assert_array_equal(relative.labels, truth)
    assert relative.threshold == pytest.approx(tau)


def test_absolute_tau_against_hand_worked_distances():
    # Points on a line: 0, 1, 3, 10. Single linkage merges at 1, 2, 7; complete at 1, 3, 10.
    vectors = np.array([[0.0], [1.0], [3.0], [10.0]])
    single = hc.hierarchical_clusters(vectors, "l2", "single", 2.0)
    np.testing.assert_allclose(single.heights, [1, 2, 7])
    np.testing.assert_array_equal(single.labels, [0, 0, 0, 1])   # merge while height <= tau
    complete = hc.hierarchical_clusters(vectors, "l1", "complete", 2.0)
    np.testing.assert_allclose(complete.heights, [1, 3, 10])
    np.testing.assert_array_equal(complete.labels, [0, 0, 1, 2])
    average = hc.hierarchical_clusters(vectors, "l2", "average", 5.0)
    np.testing.assert_allclose(average.heights, [1, 2.5, 26 / 3])  # mean {3, 2}; {10, 9, 7}
    np.testing.assert_array_equal(average.labels, [0, 0, 0, 1])
    # Ward: sqrt(2|A||B|/(|A|+|B|)) ||mu_A - mu_B||; {0,1} at 1, then {0,1}+{3} at
    # sqrt(4/3) * 2.5.
    ward = hc.hierarchical_clusters(vectors, "l2", "ward", 3.0)
    assert ward.heights[1] == pytest.approx(np.sqrt(4 / 3) * 2.5)
    np.testing.assert_array_equal(ward.labels, [0, 0, 0, 1])


@pytest.mark.parametrize("metric", ["l1", "cosine"])
def test_ward_with_a_non_euclidean_metric_is_rejected(metric):
    with pytest.raises(ValueError, match="ward linkage needs the l2"):
        hc.hierarchical_clusters(np.eye(3), metric, "ward", 1.0)


@pytest.mark.parametrize(("metric", "linkage", "mode", "threshold"), [
    ("manhattan", "single", "absolute", 1.0), ("l2", "centroid", "absolute", 1.0),
    ("l2", "single", "quantile", 1.0), ("l2", "single", "absolute", -1.0),
    ("l2", "single", "clusters", 2.5), ("l2", "single", "clusters", 0)])
def test_bad_settings_are_clear_errors(metric, linkage, mode, threshold):
    with pytest.raises(ValueError):
        hc.hierarchical_clusters(np.eye(3), metric, linkage, threshold, mode)


@pytest.mark.parametrize(("metric", "linkage"), PAIRINGS)
def test_one_cluster_and_all_singletons(metric, linkage):
    vectors, _ = groups_of_vectors()
    n = len(vectors)
    top = hc.hierarchical_clusters(vectors, metric, linkage, 3, "clusters").heights.max()
    one = hc.hierarchical_clusters(vectors, metric, linkage, top * 1.001)
    assert one.num_clusters == 1 and np.all(one.labels == 0)
    assert hc.hierarchical_clusters(vectors, metric, linkage, 1.0, "relative").num_clusters == 1
    singletons = hc.hierarchical_clusters(vectors, metric, linkage, 0.0)
    np.testing.assert_array_equal(singletons.labels, np.arange(n))


def test_an_outlier_is_its_own_cluster_and_a_single_vector_is_one_cluster():
    vectors, truth = groups_of_vectors(sizes=(6, 1))
    vectors[-1] *= 5.0   # far away from everything: a singleton cluster
    found = hc.hierarchical_clusters(vectors, "l2", "complete", 2, "clusters")
    assert np.bincount(found.labels).tolist() == [6, 1]
    np.testing.assert_array_equal(found.labels, truth)
    lone = hc.hierarchical_clusters(np.ones((1, 5)), "l1", "single", 1.0)
    assert lone.labels.tolist() == [0] and lone.linkage.shape == (0, 4)


def test_median_rule_and_a_precomputed_condensed_matrix():
    vectors, truth = groups_of_vectors(sizes=(8, 8, 8), noise=0.02)
    condensed = hc.to_condensed(hc.pairwise_distances(vectors, "l2"))
    found = hc.cluster_condensed(condensed, "average", 3.0, mode="median")
    assert found.threshold == pytest.approx(3.0 * np.median(found.heights))
    np.testing.assert_array_equal(found.labels, truth)
    with pytest.raises(ValueError, match="n\\(n-1\\)/2"):
        hc.cluster_condensed(condensed[:-1], "average", 1.0)


def test_labels_are_numbered_by_first_appearance():
    assert first_appearance_labels(np.array([5, 2, 5, 9, 2])).tolist() == [0, 1, 0, 2, 1]


def test_label_order_does_not_depend_on_the_rows_order():
    vectors, truth = groups_of_vectors()
    perm = np.random.default_rng(3).permutation(len(truth))
    for metric, linkage in itertools.islice(PAIRINGS, 0, None, 3):
        a = hc.hierarchical_clusters(vectors, metric, linkage, 3, "clusters").labels
        b = hc.hierarchical_clusters(vectors[perm], metric, linkage, 3, "clusters").labels
        # The same partition, whatever the order.
        assert len({(x, y) for x, y in zip(a[perm], b, strict=True)}) == 3
