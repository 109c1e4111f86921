"""Agglomerative (hierarchical) clustering of client vectors: distances, linkage and the cut.

Used by FL+HC (Briggs et al., 2020) on flattened client updates, and general enough for any
method that holds a precomputed distance matrix (`cluster_condensed`).

Conventions (FL+HC spec A9, A10):
- metrics "l1" (Manhattan), "l2" (Euclidean), "cosine" (1 - cos, in [0, 2]);
- linkages "single", "complete", "average" (UPGMA, what scipy calls average), "weighted" (WPGMA)
  and "ward" (Euclidean only; scipy's height sqrt(2|A||B|/(|A|+|B|)) ||mu_A - mu_B||);
- the cut merges while the merge height is <= tau (scipy `fcluster(criterion="distance")`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.cluster import hierarchy
from scipy.spatial.distance import pdist, squareform

from clusterfed.clustering import precomputed as pc
from clusterfed.clustering.precomputed import NO_STRUCTURE, choose_clusters
from clusterfed.clustering.similarity import (
    as_vectors,
    column_blocks,
    cosine_distance_matrix,
    euclidean_distance_matrix,
)

METRICS = ("l1", "l2", "cosine")
LINKAGES = (*pc.LINKAGES, "ward")   # Ward on the vectors themselves
# How the threshold is read: an absolute merge height (the paper's tau); scale-free: a
# fraction of the largest merge height, a multiple of the median merge height (most merges
# join similar clients, so the median is the within-group scale), a number of clusters, or
# the least silhouette every cluster of a cut must reach (the tree is cut into the most such
# clusters, see `precomputed.substantial_clusters`).
THRESHOLD_MODES = ("absolute", "relative", "median", "clusters", "silhouette")
# The threshold each mode reads when none is given; the others need one.
DEFAULT_THRESHOLDS = {"absolute": 3.0, "silhouette": NO_STRUCTURE}
SILHOUETTE_K_MAX = 10


@dataclass(frozen=True)
class Dendrogram:
    """A flat clustering with the tree it was cut from."""

    labels: np.ndarray     # (n,) int64, clusters numbered 0.. in order of first member
    linkage: np.ndarray    # (n - 1, 4) scipy linkage matrix: a, b, height, size
    threshold: float       # the absolute height the tree was cut at (nan for "clusters")

    @property
    def heights(self) -> np.ndarray:
        return self.linkage[:, 2]

    @property
    def num_clusters(self) -> int:
        return int(self.labels.max()) + 1 if len(self.labels) else 0


def check_metric_linkage(metric: str, linkage: str) -> None:
    """Reject unknown names and Ward with a non-Euclidean metric (its heights assume L2)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    pc.check_linkage(linkage, LINKAGES)
    if linkage == "ward" and metric != "l2":
        raise ValueError(f"ward linkage needs the l2 (Euclidean) metric, got {metric!r}")


def check_threshold(mode: str, threshold: float) -> None:
    if mode not in THRESHOLD_MODES:
        raise ValueError(f"threshold_mode must be one of {', '.join(THRESHOLD_MODES)}, "
                         f"got {mode!r}")
    if mode == "clusters":
        if threshold != int(threshold) or threshold < 1:
            raise ValueError(f"threshold_mode 'clusters' needs a whole threshold >= 1, "
                             f"got {threshold}")
    elif mode == "silhouette":
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(f"threshold_mode 'silhouette' needs a threshold in [-1, 1], "
                             f"got {threshold}")
    elif not threshold >= 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")


def pairwise_distances(vectors: np.ndarray, metric: str, *, chunk_size: int | None = None
                       ) -> np.ndarray:
    """(n, n) float64 distances between the rows of `vectors` (n x d).

    L2 and cosine come from one Gram matrix (a matrix product); L1 sums scipy's C `pdist`
    over column blocks (`chunk_size` columns, default about 32 MiB of float64). Neither loops
    over pairs in Python nor holds V in float64 at once. A zero vector is at cosine distance 1
    from every other vector.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    vectors = as_vectors(vectors)
    n = len(vectors)
    if metric == "cosine":
        return cosine_distance_matrix(vectors, chunk_size=chunk_size)
    if metric == "l1":
        condensed = np.zeros(n * (n - 1) // 2)
        for block in column_blocks(vectors, chunk_size):
            condensed += pdist(block, "cityblock")
        return squareform(condensed)
    return euclidean_distance_matrix(vectors, chunk_size=chunk_size)


def to_condensed(distances: np.ndarray) -> np.ndarray:
    """The upper triangle of a square distance matrix, as scipy's linkage takes it."""
    return squareform(np.asarray(distances, dtype=np.float64), checks=False)


def absolute_threshold(heights: np.ndarray, mode: str, threshold: float) -> float:
    """The merge height a rule cuts at: tau, or tau times the largest / median merge height."""
    if mode == "absolute":
        return float(threshold)
    if mode in ("relative", "median"):
        if not len(heights):
            return 0.0
        scale = heights.max() if mode == "relative" else np.median(heights)
        return float(threshold) * float(scale)
    return float("nan")


def cluster_condensed(condensed: np.ndarray, linkage: str, threshold: float,
                      mode: str = "absolute") -> Dendrogram:
    """Agglomerative clustering of a condensed distance matrix, cut by a threshold rule.

    "absolute": merge while the height is <= threshold; "relative": the same at threshold x
    the largest merge height (1.0 gives one cluster, 0 splits every distinct point);
    "median": at threshold x the median merge height; "clusters": cut into at most
    `threshold` clusters (scipy's "maxclust").
    """
    pc.check_linkage(linkage, LINKAGES)
    check_threshold(mode, threshold)
    condensed = np.asarray(condensed, dtype=np.float64)
    n = int(round((1 + np.sqrt(1 + 8 * len(condensed))) / 2))
    if n * (n - 1) // 2 != len(condensed):
        raise ValueError(f"a condensed distance matrix has n(n-1)/2 entries; got "
                         f"{len(condensed)}")
    if not np.all(np.isfinite(condensed)) or np.any(condensed < 0):
        raise ValueError("distances must be finite and non-negative")
    if n == 1:
        return Dendrogram(np.zeros(1, dtype=np.int64), np.zeros((0, 4)),
                          absolute_threshold(np.zeros(0), mode, threshold))
    tree = hierarchy.linkage(condensed, method=linkage)
    cut = absolute_threshold(tree[:, 2], mode, threshold)
    if mode == "silhouette":
        raw, _ = choose_clusters(
            squareform(condensed),
            lambda k: hierarchy.fcluster(tree, t=k, criterion="maxclust"), SILHOUETTE_K_MAX,
            threshold)
    elif mode == "clusters":
        raw = hierarchy.fcluster(tree, t=int(threshold), criterion="maxclust")
    else:
        raw = hierarchy.fcluster(tree, t=cut, criterion="distance")
    return Dendrogram(pc.first_appearance_labels(raw), tree, cut)


def chosen_clusters(vectors: np.ndarray, metric: str, linkage: str,
                    choose: Callable[[np.ndarray, Callable[[int], np.ndarray]], np.ndarray]
                    ) -> Dendrogram:
    """Cluster the rows of `vectors` into the K that `choose(d, labels_for_k)` takes from
    their distances d and the tree's cut into each k (a selector, `clustering/selectors.py`);
    with `precomputed.choose_clusters` at `SILHOUETTE_K_MAX` it is the "silhouette" mode."""
    check_metric_linkage(metric, linkage)
    condensed = to_condensed(pairwise_distances(vectors, metric))
    if len(vectors) < 2:
        return Dendrogram(np.zeros(len(vectors), dtype=np.int64), np.zeros((0, 4)), float("nan"))
    tree = hierarchy.linkage(condensed, method=linkage)
    raw = choose(squareform(condensed),
                 lambda k: hierarchy.fcluster(tree, t=k, criterion="maxclust"))
    return Dendrogram(pc.first_appearance_labels(raw), tree, float("nan"))


def hierarchical_clusters(vectors: np.ndarray, metric: str, linkage: str, threshold: float,
                          mode: str = "absolute") -> Dendrogram:
    """Cluster the rows of `vectors`: pairwise distances, linkage, cut (FL+HC Section II-B)."""
    check_metric_linkage(metric, linkage)
    check_threshold(mode, threshold)
    distances = pairwise_distances(vectors, metric)
    return cluster_condensed(to_condensed(distances), linkage, threshold, mode)
