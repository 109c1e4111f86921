"""Clustering from a precomputed distance matrix only (no coordinates, so no k-means).

LCFL (lcfl.md 2.5, A7, A8, A21, A26) clusters its loss dissimilarity d this way: k-medoids
(PAM's BUILD and SWAP, or the authors' "alternate" with the "heuristic" init), DBSCAN, and
agglomerative (binary hierarchical) clustering, with k given or chosen by the silhouette on d.
Every function returns labels 0..K-1 numbered by first appearance in client order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

MEDOID_METHODS = ("pam", "alternate")
MEDOID_INITS = ("build", "heuristic", "random")
# scipy's linkages that need only distances between the points. "weighted" (WPGMA) is what
# PACFL's authors call "average"; Ward needs Euclidean vectors (`hierarchical.LINKAGES`).
LINKAGES = ("average", "complete", "single", "weighted")
NOISE_RULES = ("nearest", "singletons", "together")


def check_distance(d: np.ndarray) -> np.ndarray:
    d = np.asarray(d, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"a distance matrix must be square, got shape {d.shape}")
    if not np.isfinite(d).all() or (d < 0).any():
        raise ValueError("a distance matrix must be finite and non-negative")
    return d


def check_linkage(method: str, allowed: tuple[str, ...] = LINKAGES) -> None:
    if method not in allowed:
        raise ValueError(f"linkage must be one of {', '.join(allowed)}, got {method!r}")


def first_appearance_labels(labels: np.ndarray) -> np.ndarray:
    """Cluster labels renumbered 0, 1, ... in the order their first member appears."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))
    return rank[inverse].astype(np.int64)


@dataclass(frozen=True)
class Medoids:
    medoids: np.ndarray   # indices of the k medoids
    labels: np.ndarray    # nearest medoid's position in `medoids`, per point
    cost: float           # sum of distances to the nearest medoid


def medoid_cost(d: np.ndarray, medoids: np.ndarray) -> float:
    return float(d[:, medoids].min(axis=1).sum())


def _result(d: np.ndarray, medoids: np.ndarray) -> Medoids:
    medoids = np.sort(np.asarray(medoids, dtype=np.int64))
    return Medoids(medoids, d[:, medoids].argmin(axis=1), medoid_cost(d, medoids))


def _build(d: np.ndarray, k: int) -> np.ndarray:
    """PAM's BUILD: the most central point, then greedily the point that lowers the cost most."""
    chosen = [int(d.sum(axis=1).argmin())]
    nearest = d[:, chosen[0]].copy()
    for _ in range(1, k):
        cost = np.minimum(nearest[:, None], d).sum(axis=0)
        cost[chosen] = np.inf
        best = int(cost.argmin())
        chosen.append(best)
        nearest = np.minimum(nearest, d[:, best])
    return np.array(chosen)


def _swap(d: np.ndarray, medoids: np.ndarray, max_iter: int) -> np.ndarray:
    """PAM's SWAP: apply the best improving (medoid, non-medoid) exchange until none improves.

    For each medoid slot p, `without[i]` is point i's distance to the nearest other medoid; the
    cost after swapping slot p for candidate o is sum_i min(without[i], d[i, o]).
    """
    medoids = medoids.copy()
    current = medoid_cost(d, medoids)
    for _ in range(max_iter):
        to_medoids = d[:, medoids]
        order = np.argsort(to_medoids, axis=1)
        first = to_medoids[np.arange(len(d)), order[:, 0]]
        second = (to_medoids[np.arange(len(d)), order[:, 1]] if len(medoids) > 1
                  else np.full(len(d), np.inf))
        best_cost, best_swap = current, None
        for p in range(len(medoids)):
            without = np.where(order[:, 0] == p, second, first)
            cost = np.minimum(without[:, None], d).sum(axis=0)
            cost[medoids] = np.inf
            o = int(cost.argmin())
            if cost[o] < best_cost - 1e-12 * max(1.0, abs(best_cost)):
                best_cost, best_swap = float(cost[o]), (p, o)
        if best_swap is None:
            break
        medoids[best_swap[0]] = best_swap[1]
        current = best_cost
    return medoids


def _alternate(d: np.ndarray, medoids: np.ndarray, max_iter: int) -> np.ndarray:
    """Voronoi iteration: assign to the nearest medoid, move each medoid to its cluster's centre."""
    medoids = medoids.copy()
    for _ in range(max_iter):
        labels = d[:, medoids].argmin(axis=1)
        new = medoids.copy()
        for p in range(len(medoids)):
            members = np.flatnonzero(labels == p)
            if len(members):
                new[p] = members[d[np.ix_(members, members)].sum(axis=1).argmin()]
        if np.array_equal(np.sort(new), np.sort(medoids)):
            break
        medoids = new
    return medoids


def k_medoids(d: np.ndarray, k: int, *, method: str = "pam", init: str = "build",
              restarts: int = 1, seed: int = 0, max_iter: int = 300) -> Medoids:
    """k-medoids on a distance matrix; the lowest-cost result over the restarts.

    `init`: "build" (PAM), "heuristic" (the k smallest row sums: scikit-learn-extra's, which
    the authors' code uses), or "random" (distinct points drawn from `seed`; the other inits are
    deterministic and ignore `restarts`).
    """
    d = check_distance(d)
    n = len(d)
    if not 1 <= k <= n:
        raise ValueError(f"k-medoids needs 1 <= k <= {n} points, got k={k}")
    if method not in MEDOID_METHODS or init not in MEDOID_INITS:
        raise ValueError(f"method must be one of {MEDOID_METHODS} and init one of {MEDOID_INITS}")
    rng = np.random.default_rng(seed)
    best: Medoids | None = None
    for _ in range(restarts if init == "random" else 1):
        if init == "build":
            start = _build(d, k)
        elif init == "heuristic":
            start = np.argsort(d.sum(axis=1), kind="stable")[:k]
        else:
            start = rng.choice(n, size=k, replace=False)
        found = (_swap if method == "pam" else _alternate)(d, start, max_iter)
        result = _result(d, found)
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None
    return best


def hierarchical(d: np.ndarray, *, k: int | None = None, threshold: float | None = None,
                 linkage_method: str = "average") -> np.ndarray:
    """Agglomerative clustering of d, cut into k clusters or at a distance threshold."""
    d = check_distance(d)
    if (k is None) == (threshold is None):
        raise ValueError("hierarchical clustering needs exactly one of k and threshold")
    check_linkage(linkage_method)
    if len(d) == 1:
        return np.zeros(1, dtype=np.int64)
    tree = linkage(squareform((d + d.T) / 2, checks=False), method=linkage_method)
    labels = (fcluster(tree, t=k, criterion="maxclust") if k is not None
              else fcluster(tree, t=threshold, criterion="distance"))
    return first_appearance_labels(labels)


def fence_eps(d: np.ndarray, min_samples: int) -> float:
    """DBSCAN's eps from the distances of each point to its min_samples-th nearest neighbour.

    eps is the upper Tukey fence (Q3 + 1.5 IQR) of those distances, at most their maximum:
    points whose neighbourhood is sparser than the fence allows become noise (A21 asks for a
    data-driven eps; the k-distance "knee" is unreliable when there is no noise at all).
    """
    d = check_distance(d)
    kth = np.sort(d, axis=1)[:, min(min_samples, len(d)) - 1]
    q1, q3 = np.percentile(kth, [25, 75])
    return float(min(q3 + 1.5 * (q3 - q1), kth.max())) or 1e-12


def dbscan(d: np.ndarray, *, eps: float | None = None, min_samples: int = 5,
           noise: str = "nearest") -> np.ndarray:
    """DBSCAN on d (eps None: `fence_eps`); noise points join the nearest core point's
    cluster, or become singletons, or form one cluster together (the authors' code)."""
    d = check_distance(d)
    if noise not in NOISE_RULES:
        raise ValueError(f"noise must be one of {NOISE_RULES}, got {noise!r}")
    # Imported here: a Flower node imports this module and never clusters.
    from sklearn.cluster import DBSCAN

    eps = fence_eps(d, min_samples) if eps is None else float(eps)
    fit = DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit(d)
    labels = fit.labels_.copy()
    outliers = np.flatnonzero(labels < 0)
    core = fit.core_sample_indices_
    if len(outliers) == len(labels):
        return np.zeros(len(labels), dtype=np.int64) if noise != "singletons" else \
            np.arange(len(labels))
    if noise == "nearest" and len(core):
        labels[outliers] = labels[core[d[np.ix_(outliers, core)].argmin(axis=1)]]
    elif noise == "singletons" or noise == "nearest":
        labels[outliers] = labels.max() + 1 + np.arange(len(outliers))
    else:
        labels[outliers] = labels.max() + 1
    return first_appearance_labels(labels)


def silhouette(d: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette on d; -1 where it is undefined (one cluster, or one point per cluster)."""
    k = len(np.unique(labels))
    if not 2 <= k <= len(labels) - 1:
        return -1.0
    from sklearn.metrics import silhouette_score

    return float(silhouette_score(check_distance(d), labels, metric="precomputed"))


# Kaufman and Rousseeuw (1990, ch. 2): an average silhouette of 0.25 or less means "no
# substantial structure has been found". Below it, a method keeps one cluster.
NO_STRUCTURE = 0.25


def best_by_silhouette(d: np.ndarray, labels_for_k: Callable[[int], np.ndarray], k_max: int,
                       min_silhouette: float | None = NO_STRUCTURE, min_size: int = 2
                       ) -> tuple[np.ndarray, dict[int, float]]:
    """The clustering with the best mean silhouette on d among k = 2..k_max, and the scores.

    `labels_for_k(k)` clusters into k; ties go to the smaller k. One cluster when no k fits
    (fewer than 3 points) or when the best silhouette is below `min_silhouette` (None: never):
    the silhouette compares each point's distance to its own cluster with its distance to the
    next, so it needs no scale and reads the same on losses, angles and update norms. A
    clustering with a cluster smaller than `min_size` is no candidate: a lone point's
    silhouette is 0 by definition, so it carries no evidence of a cluster, and one client far
    from the rest of its group would otherwise be cut off for that alone.
    """
    d = check_distance(d)
    scores: dict[int, float] = {}
    found: dict[int, np.ndarray] = {}
    for k in range(2, min(k_max, len(d) - 1) + 1):
        labels = labels_for_k(k)
        if np.unique(labels, return_counts=True)[1].min() < min_size:
            continue
        found[k] = labels
        scores[k] = silhouette(d, labels)
    one = np.zeros(len(d), dtype=np.int64)
    if not scores:
        return one, scores
    best = max(scores, key=lambda k: (scores[k], -k))
    if min_silhouette is not None and scores[best] < min_silhouette:
        return one, scores
    return first_appearance_labels(found[best]), scores


def weakest_silhouette(d: np.ndarray, labels: np.ndarray) -> float:
    """The lowest of the clusters' mean silhouettes on d (Kaufman and Rousseeuw's per-cluster
    silhouette width): the score `substantial_clusters` judges a clustering by."""
    from sklearn.metrics import silhouette_samples

    labels = first_appearance_labels(labels)
    widths = silhouette_samples(check_distance(d), labels, metric="precomputed")
    return float(min(widths[labels == c].mean() for c in range(int(labels.max()) + 1)))


def points_moved(a: np.ndarray, b: np.ndarray) -> int:
    """The fewest points whose labels must change to turn partition a into b (clusters matched
    one to one by the Hungarian method, scipy's linear_sum_assignment)."""
    from scipy.optimize import linear_sum_assignment

    a, b = first_appearance_labels(a), first_appearance_labels(b)
    overlap = np.zeros((int(a.max()) + 1, int(b.max()) + 1), dtype=np.int64)
    np.add.at(overlap, (a, b), 1)
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    return int(len(a) - overlap[rows, cols].sum())


def strongest(d: np.ndarray, partitions: Sequence[np.ndarray], min_size: int = 2) -> np.ndarray:
    """Of several partitions of the same points into the same k, the one whose weakest cluster
    scores highest (`weakest_silhouette`); a partition with a cluster of fewer than `min_size`
    points counts only when all have one. Ties go to the first."""
    def score(labels: np.ndarray) -> tuple[bool, float]:
        small = np.bincount(first_appearance_labels(labels)).min() < min_size
        return (not small, weakest_silhouette(d, labels) if len(np.unique(labels)) > 1 else -1.0)

    scored = [score(labels) for labels in partitions]
    return first_appearance_labels(partitions[max(range(len(partitions)),
                                                  key=lambda i: (scored[i], -i))])


def substantial_clusters(d: np.ndarray, labels_for_k: Callable[[int], np.ndarray], k_max: int,
                         min_silhouette: float = NO_STRUCTURE, min_size: int = 2,
                         min_separation: float = 0.1) -> tuple[np.ndarray, dict[int, float]]:
    """The most clusters (k <= k_max) of which every one is substantial, and each k's score.

    A clustering's score is its weakest cluster's mean silhouette (Kaufman and Rousseeuw's
    per-cluster silhouette width). The largest k whose score reaches `min_silhouette` wins;
    none does: one cluster. Unlike the best mean silhouette, this sees nested structure (four
    rotations in two pairs score best at k = 2 on the mean, yet all four clusters stand apart),
    and it does not cut a homogeneous group in two, since the halves of a group with no
    structure lie close to each other.

    The silhouette is relative: a group far from all others that holds two tight subgroups
    scores well cut in two. So a clustering also needs every cluster's separation (the mean
    distance of its points to the nearest other cluster) to be at least `min_separation` of
    the federation's scale, the weakest separation of its most clearly separated candidate
    clustering: structure at a tenth of that scale is detail, not a cluster. Clusterings with
    a cluster of fewer than `min_size` points are no candidates (a lone point's silhouette is
    0 by definition).
    """
    d = check_distance(d)
    scores: dict[int, float] = {}
    candidates: dict[int, tuple[np.ndarray, float]] = {}
    for k in range(2, min(k_max, len(d) - 1) + 1):
        labels = first_appearance_labels(labels_for_k(k))
        counts = np.bincount(labels)
        if len(counts) < 2 or counts.min() < min_size:
            continue
        scores[k] = weakest_silhouette(d, labels)
        # Mean distance of each point to each cluster; then to its nearest other cluster.
        to_cluster = np.stack([d[:, labels == c].mean(axis=1) for c in range(len(counts))], 1)
        to_cluster[np.arange(len(d)), labels] = np.inf
        nearest = to_cluster.min(axis=1)
        separation = np.array([nearest[labels == c].mean() for c in range(len(counts))])
        candidates[k] = (labels, float(separation.min()))
    # The federation's scale: the separation of its most clearly separated clustering.
    scale = max((weakest for _, weakest in candidates.values()), default=0.0)
    best = np.zeros(len(d), dtype=np.int64)
    for k, (labels, weakest) in sorted(candidates.items()):
        if scores[k] >= min_silhouette and weakest >= min_separation * scale:
            best = labels
    return best, scores


def choose_clusters(d: np.ndarray, labels_for_k: Callable[[int], np.ndarray], k_max: int,
                    min_silhouette: float | None = NO_STRUCTURE
                    ) -> tuple[np.ndarray, dict[int, float]]:
    """The number of clusters from d alone: :func:`substantial_clusters` with a floor, or the
    best mean silhouette (:func:`best_by_silhouette`, never one cluster) without one."""
    if min_silhouette is None:
        return best_by_silhouette(d, labels_for_k, k_max, None)
    return substantial_clusters(d, labels_for_k, k_max, min_silhouette)
