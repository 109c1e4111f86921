"""The K selectors (clustering/selectors.py) on hand-made points with a known number of groups:
three separated blobs of unequal sizes, and one blob, where every selector that can say "one
cluster" must say it."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from sklearn.metrics import adjusted_rand_score

from clusterfed.clustering import precomputed as pc
from clusterfed.clustering import selectors as sel

ONE_CAPABLE = ("silhouette", "eigengap", "gap", "hdbscan")


def blobs(sizes: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Groups of 10-D points (as clients' updates: many coordinates) around centres 8 along
    distinct axes, unit spread: their distances and the truth."""
    rng = np.random.default_rng(seed)
    centres = 8.0 * np.eye(10)[:len(sizes)]
    x = np.concatenate([c + rng.normal(size=(n, 10)) for c, n in zip(centres, sizes,
                                                                     strict=True)])
    truth = np.repeat(np.arange(len(sizes)), sizes)
    return cdist(x, x), truth


def average_linkage(d: np.ndarray):
    return lambda k: pc.hierarchical(d, k=k, linkage_method="average")


@pytest.mark.parametrize("name", sel.SELECTORS)
@pytest.mark.parametrize("seed", [0, 1])
def test_three_unequal_groups_found(name: str, seed: int) -> None:
    d, truth = blobs([12, 8, 4], seed)
    labels = sel.select(name, d, average_linkage(d), 8)
    assert adjusted_rand_score(truth, labels) == 1.0


@pytest.mark.parametrize("name", sel.SELECTORS)
def test_four_groups_found(name: str) -> None:
    d, truth = blobs([6, 6, 6, 6], 2)
    assert adjusted_rand_score(truth, sel.select(name, d, average_linkage(d), 8)) == 1.0


@pytest.mark.parametrize("name", ONE_CAPABLE)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_group_is_one_cluster(name: str, seed: int) -> None:
    d, _ = blobs([30], seed)
    labels = sel.select(name, d, average_linkage(d), 8)
    assert (labels == 0).all()


def test_labels_numbered_by_first_appearance() -> None:
    d, _ = blobs([4, 5, 6], 0)
    order = np.arange(len(d))[::-1]
    labels = sel.select("hdbscan", d[np.ix_(order, order)], average_linkage(d), 8)
    assert labels[0] == 0 and set(labels) == {0, 1, 2}


def test_unknown_selector_named() -> None:
    with pytest.raises(ValueError, match="unknown selector 'elbow'; valid: silhouette"):
        sel.select("elbow", np.zeros((3, 3)), lambda k: np.zeros(3), 2)
