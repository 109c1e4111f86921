"""Choosing the number of clusters K from a distance matrix: one pure function per rule.

Every selector takes the clients' distance matrix `d` (n x n), the method's own clustering
for a given k (`labels_for_k`, used by the rules that score candidate clusterings) and
`k_max`, and returns labels 0..K-1 numbered by first appearance (one cluster: all zero).

| selector       | rule                                                        | can say 1 |
|----------------|-------------------------------------------------------------|-----------|
| silhouette     | today's rule (`precomputed.choose_clusters`): the most      | yes       |
|                | clusters all of whose silhouettes reach `min_silhouette`    |           |
| eigengap       | the largest gap in the normalised Laplacian's spectrum of   | yes       |
|                | the self-tuned affinity graph (Zelnik-Manor & Perona 2004)  |           |
| gap            | Tibshirani, Walther & Hastie's (2001) gap statistic on a    | yes       |
|                | classical-MDS embedding of d, uniform references            |           |
| davies_bouldin | the smallest Davies-Bouldin index over k = 2..k_max         | no (only  |
|                |                                                             | with no   |
|                |                                                             | candidate)|
| hdbscan        | scikit-learn's HDBSCAN on d; noise joins its nearest        | yes       |
|                | cluster                                                     |           |
| hdbscan_       | whichever of hdbscan and silhouette finds more clusters     | yes       |
| silhouette     | (the silhouette's on a tie; PACFL's default)                |           |
| silhouette_gap | the silhouette rule's clusters where it finds any, else the | yes       |
|                | gap statistic's                                             |           |
| silhouette_    | the silhouette rule's clusters where it finds any; else,    | yes       |
| gap_width      | where the gap statistic finds more than one, the candidate  |           |
|                | of the widest mean silhouette (Kaufman & Rousseeuw 1990)    |           |
|                | (IFCA's and FL+HC's default)                                |           |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from clusterfed.clustering.precomputed import (
    NO_STRUCTURE,
    best_by_silhouette,
    check_distance,
    choose_clusters,
    first_appearance_labels,
)

LabelsForK = Callable[[int], np.ndarray]
SELECTORS = ("silhouette", "eigengap", "gap", "davies_bouldin", "hdbscan", "hdbscan_silhouette",
             "silhouette_gap", "silhouette_gap_width")


def _one(d: np.ndarray) -> np.ndarray:
    return np.zeros(len(d), dtype=np.int64)


def _ks(d: np.ndarray, k_max: int) -> range:
    return range(2, min(k_max, len(d) - 1) + 1)


def silhouette_selector(d: np.ndarray, labels_for_k: LabelsForK, k_max: int,
                        min_silhouette: float | None = NO_STRUCTURE) -> np.ndarray:
    """Today's rule, unchanged: `precomputed.choose_clusters`."""
    return choose_clusters(d, labels_for_k, k_max, min_silhouette)[0]


def affinity(d: np.ndarray, neighbours: int = 3) -> np.ndarray:
    """Self-tuning affinity exp(-d_ij^2 / (s_i s_j)), s_i the distance to i's `neighbours`-th
    nearest point: each point's scale is local, so tight and loose clusters both connect."""
    d = check_distance(d)
    m = min(neighbours, len(d) - 1)
    scale = np.sort(d, axis=1)[:, m]
    scale = np.where(scale > 0, scale, max(float(scale.max()), 1e-12))
    a = np.exp(-(d ** 2) / np.outer(scale, scale))
    np.fill_diagonal(a, 0.0)
    return a


def eigengap_k(d: np.ndarray, k_max: int, neighbours: int = 3) -> int:
    """K at the largest gap lambda_{K+1} - lambda_K among the normalised Laplacian's smallest
    eigenvalues (scipy): K nearly disconnected groups give K eigenvalues near 0."""
    from scipy.linalg import eigvalsh
    from scipy.sparse.csgraph import laplacian

    if len(d) < 3:
        return 1
    values = eigvalsh(laplacian(affinity(d, neighbours), normed=True))
    top = min(k_max, len(d) - 1)
    return int(np.argmax(np.diff(values[:top + 1]))) + 1


def eigengap_selector(d: np.ndarray, labels_for_k: LabelsForK, k_max: int,
                      neighbours: int = 3) -> np.ndarray:
    k = eigengap_k(d, k_max, neighbours)
    return _one(d) if k == 1 else first_appearance_labels(labels_for_k(k))


def embedding(d: np.ndarray, dims: int | None = None) -> np.ndarray:
    """Classical MDS (Torgerson): coordinates whose Euclidean distances best match d, along
    their principal axes (scipy's symmetric eigensolver), the `dims` largest only."""
    from scipy.linalg import eigh

    d = check_distance(d)
    n = len(d)
    centre = np.eye(n) - 1.0 / n
    b = -0.5 * centre @ (d ** 2) @ centre
    values, vectors = eigh(b)
    values, vectors = values[::-1][:dims], vectors[:, ::-1][:, :dims]
    keep = values > 1e-9 * max(float(values.max()), 1e-300)
    return vectors[:, keep] * np.sqrt(values[keep])


def _dispersion(x: np.ndarray, labels: np.ndarray) -> float:
    """Within-cluster sum of squared distances to the centroids (Tibshirani's W_k)."""
    return float(sum(((x[labels == c] - x[labels == c].mean(axis=0)) ** 2).sum()
                     for c in np.unique(labels)))


def gap_k(x: np.ndarray, labels_for_k: LabelsForK, k_max: int, references: int = 10,
          seed: int = 0) -> int:
    """The smallest k whose Gap(k) is within one standard error of the largest gap (Dudoit &
    Fridlyand 2002; R cluster::clusGap's "globalSEmax"); references uniform over the bounding
    box of x's principal axes (Tibshirani et al. 2001), clustered by scikit-learn's KMeans.
    Tibshirani's first local maximum stops at k = 1 whenever splitting off one group gains
    nothing (four groups in two pairs), so the global one is used."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    n = len(x)
    ks = [1, *range(2, min(k_max, n - 1) + 1)]
    if len(ks) == 1 or x.shape[1] == 0:
        return 1
    rng = np.random.default_rng(seed)
    low, high = x.min(axis=0), x.max(axis=0)
    refs = [rng.uniform(low, high, size=x.shape) for _ in range(references)]
    gaps, spreads = [], []
    # One OpenMP thread: on references of a few hundred points the threads' start-up costs
    # some 20 times the fit (k = 1..10 on 20 points: 0.76 s against 0.04 s), same inertias.
    with threadpool_limits(1):
        for k in ks:
            labels = np.zeros(n, dtype=np.int64) if k == 1 else labels_for_k(k)
            logs = np.log([max(KMeans(k, n_init=3, random_state=seed).fit(r).inertia_, 1e-300)
                           for r in refs])
            gaps.append(float(logs.mean() - np.log(max(_dispersion(x, labels), 1e-300))))
            spreads.append(float(logs.std() * np.sqrt(1 + 1 / references)))
    top = int(np.argmax(gaps))
    return next(k for k, g in zip(ks, gaps, strict=True) if g >= gaps[top] - spreads[top])


def gap_selector(d: np.ndarray, labels_for_k: LabelsForK, k_max: int, references: int = 10,
                 seed: int = 0) -> np.ndarray:
    # K groups span K - 1 axes; the remaining ones are within-group noise, whose uniform
    # references would inflate every gap alike.
    k = gap_k(embedding(d, k_max), labels_for_k, k_max, references, seed)
    return _one(d) if k == 1 else first_appearance_labels(labels_for_k(k))


def davies_bouldin_selector(d: np.ndarray, labels_for_k: LabelsForK, k_max: int,
                            min_size: int = 2) -> np.ndarray:
    """The k in 2..k_max with the smallest Davies-Bouldin index (scikit-learn) on d's MDS
    embedding; the index is undefined for one cluster, so this rule never chooses one. As for
    the silhouette, a clustering with a cluster under `min_size` is no candidate (a lone
    point has no spread, so it would score as perfectly tight)."""
    from sklearn.metrics import davies_bouldin_score

    x = embedding(d)
    best: tuple[float, np.ndarray] | None = None
    for k in _ks(d, k_max):
        labels = labels_for_k(k)
        counts = np.unique(labels, return_counts=True)[1]
        if len(counts) < 2 or counts.min() < min_size:
            continue
        score = float(davies_bouldin_score(x, labels))
        if best is None or score < best[0]:
            best = (score, labels)
    return _one(d) if best is None else first_appearance_labels(best[1])


def hdbscan_selector(d: np.ndarray, labels_for_k: LabelsForK, k_max: int,
                     min_cluster_size: int = 3) -> np.ndarray:
    """scikit-learn's HDBSCAN on d, its own K (capped by nothing but the data); a point it
    calls noise joins the cluster of its nearest clustered point; all noise: one cluster."""
    from sklearn.cluster import HDBSCAN

    d = check_distance(d)
    if len(d) <= min_cluster_size:
        return _one(d)
    labels = HDBSCAN(min_cluster_size=min_cluster_size, metric="precomputed",
                     allow_single_cluster=True, copy=True).fit_predict(d)
    clustered = labels >= 0
    if not clustered.any():
        return _one(d)
    nearest = np.where(clustered)[0][d[:, clustered].argmin(axis=1)]
    return first_appearance_labels(np.where(clustered, labels, labels[nearest]))


def hdbscan_silhouette_selector(d: np.ndarray, labels_for_k: LabelsForK, k_max: int,
                                min_cluster_size: int = 3,
                                min_silhouette: float | None = NO_STRUCTURE) -> np.ndarray:
    """Of HDBSCAN's clustering and the silhouette rule's, the one with more clusters (the
    silhouette's on a tie). Each errs by merging, not splitting: the silhouette's floor
    merges a small cluster into a near one, HDBSCAN's most stable clusters can be the parents
    of tight groups, and two diffuse groups can be one density to it; neither split an iid
    federation where measured (docs/benchmark.md, "Selectors")."""
    density = hdbscan_selector(d, labels_for_k, k_max, min_cluster_size)
    silhouette = silhouette_selector(d, labels_for_k, k_max, min_silhouette)
    return density if density.max() > silhouette.max() else silhouette


def silhouette_gap_selector(d: np.ndarray, labels_for_k: LabelsForK, k_max: int,
                            references: int = 10,
                            min_silhouette: float | None = NO_STRUCTURE) -> np.ndarray:
    """The silhouette rule's clusters where it finds more than one, else the gap statistic's.
    On clients' updates with label skew inside every cluster each cluster's silhouette falls
    under the rule's floor, while the gap statistic still sees equal clusters; where the
    silhouette rule finds clusters the gap statistic can cut a diffuse one into several. Neither
    split an iid federation where measured (docs/benchmark.md, "Selectors for the update-based
    methods")."""
    silhouette = silhouette_selector(d, labels_for_k, k_max, min_silhouette)
    return silhouette if silhouette.max() > 0 else gap_selector(d, labels_for_k, k_max,
                                                                 references)


def widest_silhouette(d: np.ndarray, labels_for_k: LabelsForK, k_max: int) -> np.ndarray:
    """The candidate k in 2..k_max of the largest mean silhouette width on d, the smaller k on
    a tie: `precomputed.best_by_silhouette` with no floor. Candidates with a lone client stay
    (`min_size=1`), as measured in docs/benchmark.md; a candidate of one cluster scores -1."""
    return best_by_silhouette(d, labels_for_k, k_max, None, min_size=1)[0]


def silhouette_gap_width_selector(d: np.ndarray, labels_for_k: LabelsForK, k_max: int,
                                  references: int = 10,
                                  min_silhouette: float | None = NO_STRUCTURE) -> np.ndarray:
    """The silhouette rule's clusters where it finds more than one; else, where the gap
    statistic finds more than one cluster, the candidate of the widest mean silhouette; else
    one. The gap statistic tells structure from none (a mean silhouette is undefined for one
    cluster), the widest silhouette tells how many: where label skew inside every cluster
    puts each cluster's silhouette under the rule's floor, the gap statistic's own K cuts a
    large diffuse cluster into several, while the widest silhouette keeps it whole
    (docs/benchmark.md, "Selectors for the update-based methods")."""
    silhouette = silhouette_selector(d, labels_for_k, k_max, min_silhouette)
    if silhouette.max() > 0:
        return silhouette
    if gap_k(embedding(d, k_max), labels_for_k, k_max, references) == 1:
        return _one(d)
    return widest_silhouette(d, labels_for_k, k_max)


def select(name: str, d: np.ndarray, labels_for_k: LabelsForK, k_max: int,
           params: Mapping[str, Any] | None = None) -> np.ndarray:
    """The named selector's labels (`SELECTORS`), with its parameters."""
    rules: dict[str, Callable[..., np.ndarray]] = {
        "silhouette": silhouette_selector, "eigengap": eigengap_selector, "gap": gap_selector,
        "davies_bouldin": davies_bouldin_selector, "hdbscan": hdbscan_selector,
        "hdbscan_silhouette": hdbscan_silhouette_selector,
        "silhouette_gap": silhouette_gap_selector,
        "silhouette_gap_width": silhouette_gap_width_selector}
    if name not in rules:
        raise ValueError(f"unknown selector {name!r}; valid: {', '.join(SELECTORS)}")
    return rules[name](d, labels_for_k, k_max, **dict(params or {}))
