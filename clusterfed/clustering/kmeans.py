"""K-means on client vectors (models, updates, their descriptions), k given or from the data.

FeSEM (its centres are K-means on the clients' models) and FlexCFL (K-means++ on the decomposed
cosine similarities) both cluster coordinates, not a distance matrix. scikit-learn's KMeans
(Lloyd, k-means++ seeding, `n_init` seeded starts) does the job; with k from the data the
candidate k's are judged by `precomputed.substantial_clusters` on a distance matrix the caller
gives, so every method that finds k from the data reads the same silhouette rule.
"""

from __future__ import annotations

import numpy as np

from clusterfed.clustering.precomputed import (
    NO_STRUCTURE,
    first_appearance_labels,
    substantial_clusters,
)

K_MAX = 10


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


def kmeans_clusters(points: np.ndarray, distances: np.ndarray, seed: int, k: int | None = None,
                    k_max: int = K_MAX, min_silhouette: float = NO_STRUCTURE) -> np.ndarray:
    """K-means labels of `points` with k given, or with the most clusters (up to k_max) of which
    each is substantial on `distances` (`substantial_clusters`; none: one cluster)."""
    if k is not None:
        return kmeans_labels(points, min(k, len(points)), seed)
    labels, _ = substantial_clusters(distances, lambda j: kmeans_labels(points, j, seed), k_max,
                                     min_silhouette)
    return labels
