"""PACFL's server mathematics (Vahidian, Morafah et al., 2023): principal angles between the
clients' data signatures, and hierarchical clustering of the proximity matrix with a threshold
in degrees.

A signature is a (d, c) matrix of left singular vectors of a client's data (columns are
samples, footnote 2) with a label per column (the class its block came from, -1 for a
whole-client SVD); the client computes it (`clusterfed/client/signature.py`). Angles are in
degrees everywhere. Spec: ../shared/specs/pacfl.md 2.1-2.5.

Measures (spec 2.2 and 7, items 4-6):

| measure         | A[i, j]                                                             |
|-----------------|---------------------------------------------------------------------|
| `min_pair`      | min over column pairs of arccos |<u_a, w_b>| (Eq. 2 as the authors'   |
|                 | code computes it; `absolute=False` drops the |.| as that code does) |
| `principal_min` | the smallest principal angle arccos sigma_max(Q_i^T Q_j) (Eq. 2)    |
| `ordered_sum`   | sum_l arccos |<u_l, w_l>|, columns in identical order (Eq. 3)        |
| `principal_sum` | sum of all min(c_i, c_j) principal angles                           |
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from clusterfed.clustering.precomputed import check_linkage, first_appearance_labels

MEASURES = ("min_pair", "principal_min", "ordered_sum", "principal_sum")
# Rows of the Gram matrix per chunk when many signatures are compared (bounds memory).
CHUNK_COLUMNS = 4096


def orthonormal_basis(u: np.ndarray) -> np.ndarray:
    """An orthonormal basis of span(u): stacked per-class blocks are not mutually orthogonal."""
    q, s, _ = np.linalg.svd(np.asarray(u, dtype=np.float64), full_matrices=False)
    tol = (s[0] if len(s) else 0.0) * max(u.shape) * np.finfo(np.float64).eps
    return q[:, s > tol]


# Proximity -----------------------------------------------------------------------------------


def _stack_padded(signatures: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(n, d, w) with zero columns padding each signature to the widest, and the widths."""
    widths = np.array([s.shape[1] for s in signatures], dtype=np.int64)
    d = signatures[0].shape[0]
    out = np.zeros((len(signatures), d, int(widths.max())))
    for i, s in enumerate(signatures):
        out[i, :, :s.shape[1]] = s
    return out, widths


def _min_pair_block(rows: Sequence[np.ndarray], cols: Sequence[np.ndarray], absolute: bool
                    ) -> np.ndarray:
    """arccos of the largest (absolute) cosine between any column of i and any column of j."""
    right = np.hstack(cols)
    col_starts = np.cumsum([0] + [c.shape[1] for c in cols[:-1]])
    out = np.empty((len(rows), len(cols)))
    # Chunks of whole row signatures keep the Gram matrix bounded.
    start = 0
    while start < len(rows):
        stop, width = start, 0
        while stop < len(rows) and (stop == start or width + rows[stop].shape[1] <= CHUNK_COLUMNS):
            width += rows[stop].shape[1]
            stop += 1
        chunk = rows[start:stop]
        gram = np.hstack(chunk).T @ right
        if absolute:
            gram = np.abs(gram)
        row_starts = np.cumsum([0] + [r.shape[1] for r in chunk[:-1]])
        best = np.maximum.reduceat(np.maximum.reduceat(gram, row_starts, axis=0),
                                   col_starts, axis=1)
        out[start:stop] = best
        start = stop
    return np.degrees(np.arccos(np.clip(out, -1.0, 1.0)))


def _principal_block(rows: Sequence[np.ndarray], cols: Sequence[np.ndarray], total: bool
                     ) -> np.ndarray:
    """Principal angles from the singular values of Q_i^T Q_j, batched over all pairs."""
    q_rows, w_rows = _stack_padded([orthonormal_basis(u) for u in rows])
    q_cols, w_cols = _stack_padded([orthonormal_basis(u) for u in cols])
    out = np.empty((len(rows), len(cols)))
    per_pair = q_rows.shape[2] * q_cols.shape[2]
    step = max(1, CHUNK_COLUMNS * CHUNK_COLUMNS // 4 // max(per_pair * len(cols), 1))
    for start in range(0, len(rows), step):
        cross = np.einsum("adk,bdl->abkl", q_rows[start:start + step], q_cols)
        sigma = np.clip(np.linalg.svd(cross, compute_uv=False), 0.0, 1.0)  # descending
        angles = np.degrees(np.arccos(sigma))
        if not total:
            out[start:start + step] = angles[..., 0]
            continue
        # Padding adds zero singular values; only min(c_i, c_j) principal angles exist.
        count = np.minimum(w_rows[start:start + step, None], w_cols[None, :])
        mask = np.arange(angles.shape[-1]) < count[..., None]
        out[start:start + step] = (angles * mask).sum(axis=-1)
    return out


def _ordered_sum_block(rows: Sequence[np.ndarray], cols: Sequence[np.ndarray]) -> np.ndarray:
    widths = {u.shape[1] for u in [*rows, *cols]}
    if len(widths) != 1:
        raise ValueError("measure 'ordered_sum' (Eq. 3) pairs the l-th vectors of two "
                         "signatures and needs equal column counts; got widths "
                         f"{sorted(widths)} (use principal_sum, or a whole-client signature)")
    a, b = np.stack(rows), np.stack(cols)
    cosines = np.abs(np.einsum("adl,bdl->abl", a, b))
    return np.degrees(np.arccos(np.clip(cosines, 0.0, 1.0))).sum(axis=-1)


def proximity_block(rows: Sequence[np.ndarray], cols: Sequence[np.ndarray],
                    measure: str = "min_pair", absolute: bool = True) -> np.ndarray:
    """A[i, j] between signature rows[i] and cols[j], in degrees (smaller: more similar)."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    if not len(rows) or not len(cols):
        return np.zeros((len(rows), len(cols)))
    if any(u.shape[1] == 0 for u in [*rows, *cols]):
        raise ValueError("every signature needs at least one column")
    if measure == "min_pair":
        return _min_pair_block(rows, cols, absolute)
    if measure == "ordered_sum":
        return _ordered_sum_block(rows, cols)
    return _principal_block(rows, cols, total=measure == "principal_sum")


def _tidy(a: np.ndarray) -> np.ndarray:
    """Symmetric with a zero diagonal: removes rounding differences between A and A^T."""
    a = (a + a.T) / 2.0
    np.fill_diagonal(a, 0.0)
    return a


def proximity_matrix(signatures: Sequence[np.ndarray], measure: str = "min_pair",
                     absolute: bool = True) -> np.ndarray:
    """The clients' proximity matrix A (Eq. 2 or Eq. 3), symmetric, zero diagonal, degrees."""
    return _tidy(proximity_block(signatures, signatures, measure, absolute))


def extend_proximity(old: np.ndarray, old_signatures: Sequence[np.ndarray],
                     new_signatures: Sequence[np.ndarray], measure: str = "min_pair",
                     absolute: bool = True) -> np.ndarray:
    """PME (Algorithm 2) corrected: the old block kept, the old-new and new-new blocks filled.

    The printed Algorithm 2 fills only the new-new block; hierarchical clustering also needs
    the cross block, so it is computed here (spec 2.5).
    """
    m = len(old_signatures)
    if old.shape != (m, m):
        raise ValueError(f"the old matrix is {old.shape} for {m} signatures")
    cross = proximity_block(old_signatures, new_signatures, measure, absolute)
    inner = proximity_matrix(new_signatures, measure, absolute)
    return np.block([[old, cross], [cross.T, inner]])


# Hierarchical clustering ---------------------------------------------------------------------


def linkage_tree(proximity: np.ndarray, method: str = "weighted") -> np.ndarray:
    """scipy's linkage matrix of A (n-1 merges: the two clusters, their distance, the size).

    "weighted" (WPGMA) is what the authors' code calls "average" (spec 2.3).
    """
    check_linkage(method)
    if len(proximity) < 2:
        return np.zeros((0, 4))
    return linkage(squareform(_tidy(np.asarray(proximity, dtype=np.float64)), checks=False),
                   method)


def cut_tree(tree: np.ndarray, n: int, beta: float | None = None,
             n_clusters: int | None = None) -> np.ndarray:
    """Flat clusters: merge while the linkage distance is <= beta, or cut into n_clusters."""
    if n < 2:
        return np.zeros(n, dtype=np.int64)
    if n_clusters is not None:
        labels = fcluster(tree, t=n_clusters, criterion="maxclust")
    elif beta is not None:
        labels = fcluster(tree, t=beta, criterion="distance")
    else:
        raise ValueError("give beta or n_clusters")
    return first_appearance_labels(labels)


def cut_threshold(tree: np.ndarray, n_clusters: int) -> float:
    """The height that cuts `tree` into n_clusters: halfway between the last merge kept and
    the first merge not made (the beta that would give the same clusters)."""
    heights = np.sort(np.asarray(tree, dtype=np.float64)[:, 2]) if len(tree) else np.zeros(0)
    done = len(heights) - (n_clusters - 1)
    if len(heights) == 0 or done < 0:
        return 0.0
    below = heights[done - 1] if done > 0 else 0.0
    above = heights[done] if done < len(heights) else heights[-1] * 1.05 + 1e-9
    return float((below + above) / 2)


def mean_distance_to_clusters(distances: np.ndarray, labels: np.ndarray, n_clusters: int
                              ) -> np.ndarray:
    """UPGMA distance from one point to each cluster: the mean of `distances` (to every
    clustered point) over the cluster's members; inf for a cluster with no member."""
    sums = np.bincount(labels, weights=distances, minlength=n_clusters)
    counts = np.bincount(labels, minlength=n_clusters)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.inf)


def hierarchical_clusters(proximity: np.ndarray, beta: float | None = None,
                          method: str = "weighted", n_clusters: int | None = None
                          ) -> np.ndarray:
    """HC(A, beta) of Algorithm 1: the number of clusters comes from the threshold."""
    return cut_tree(linkage_tree(proximity, method), len(proximity), beta, n_clusters)


def clusters_against_beta(tree: np.ndarray, n: int, betas: Sequence[float]) -> np.ndarray:
    """How many clusters each threshold gives (Figs. 2 and 6's red bars)."""
    return np.array([len(np.unique(cut_tree(tree, n, beta=float(b)))) if n > 1 else n
                     for b in betas], dtype=np.int64)


def match_clusters(previous: np.ndarray, current: np.ndarray) -> np.ndarray:
    """For each cluster of `current`, the `previous` cluster most of its members had (or -1).

    Both are label arrays over the same clients; -1 in `previous` marks clients it lacked.
    """
    out = np.full(int(current.max()) + 1 if len(current) else 0, -1, dtype=np.int64)
    known = previous >= 0
    if not known.any():
        return out
    counts = np.zeros((len(out), int(previous[known].max()) + 1), dtype=np.int64)
    np.add.at(counts, (current[known], previous[known]), 1)
    has = counts.sum(axis=1) > 0
    out[has] = counts[has].argmax(axis=1)
    return out
