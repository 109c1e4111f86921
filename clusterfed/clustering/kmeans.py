"""K-means on client vectors (models, updates, their descriptions), k given or from the data.

FeSEM (its centres are K-means on the clients' models) and FlexCFL (K-means++ on the decomposed
cosine similarities) both cluster coordinates, not a distance matrix. scikit-learn's KMeans
(Lloyd, k-means++ seeding, `n_init` seeded starts) does the job; with k from the data the
candidate k's are judged by `precomputed.substantial_clusters` on a distance matrix the caller
gives, so every method that finds k from the data reads the same silhouette rule.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from clusterfed.clustering.precomputed import (
    NO_STRUCTURE,
    first_appearance_labels,
    substantial_clusters,
)

K_MAX = 10
# A choice of K: (distances, labels at each k) -> labels.
Choose = Callable[[np.ndarray, Callable[[int], np.ndarray]], np.ndarray]


def kmeans_labels(points: np.ndarray, k: int, seed: int, n_init: int = 10) -> np.ndarray:
    """K-means++ then Lloyd, the lowest inertia of `n_init` seeded starts; labels numbered by
    first appearance (so the same partition always has the same labels)."""
    points = np.asarray(points)
    if points.ndim != 2 or not 1 <= k <= len(points):
        raise ValueError(f"k-means needs 1 <= k <= {len(points)} points (m x d), got k={k}")
    if k == 1:
        return np.zeros(len(points), dtype=np.int64)
    # Imported here: a Flower node imports the algorithms and never clusters.
    from sklearn.cluster import KMeans

    fit = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed).fit(points)
    return first_appearance_labels(fit.labels_)


def substantial(d: np.ndarray, labels_for_k: Callable[[int], np.ndarray]) -> np.ndarray:
    """The default choice of K: the most clusters (up to K_MAX) of which each is substantial
    on d (`substantial_clusters`; none: one cluster)."""
    return substantial_clusters(d, labels_for_k, K_MAX, NO_STRUCTURE)[0]


def kmeans_clusters(points: np.ndarray, distances: np.ndarray, seed: int, k: int | None = None,
                    choose: Choose = substantial) -> np.ndarray:
    """K-means labels of `points` with k given, or into the K that `choose` (a selector of
    `selectors.py`) takes from `distances` and the K-means labels at each k."""
    if k is not None:
        return kmeans_labels(points, min(k, len(points)), seed)
    return choose(distances, lambda j: kmeans_labels(points, j, seed))
