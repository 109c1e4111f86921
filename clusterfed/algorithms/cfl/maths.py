"""The clustering mathematics of CFL (Sattler, Müller, Samek), as pure functions.

Equation and algorithm numbers are those of the paper (arXiv 1910.01991v1); "spec" is
``shared/specs/cfl.md``. Every function takes numpy arrays and returns new arrays or floats; none
mutates its inputs.

Positions and client ids. The similarity functions and the bipartitions work on *positions* into
the matrix they are given. When a cluster below the root is split, that matrix is the sub-matrix of
the cluster's members, so position p means client ``member_ids[p]``: translate with
:func:`map_to_clients` before storing a partition. The authors' notebook appended the positions
themselves as client ids, which is wrong for every split below the first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Algorithm 1 and the separation gap are shared (`clustering/bipartition.py`); CFL's modules
# still name them cfl_math.*.
from clusterfed.clustering.bipartition import (  # noqa: F401
    alpha_cross_max,
    checked_parts,
    complete_linkage_bipartition,
    optimal_bipartition,
    separation_gap,
)
from clusterfed.clustering.similarity import as_vectors, column_blocks

# --------------------------------------------------------------------------------------------
# Update norms (Eqs. 32/33; Alg. 5 line 16); the cosine similarities (Eqs. 13, 44/51) are
# `similarity.cosine_similarity_matrix`.
# --------------------------------------------------------------------------------------------


def update_norms(updates: np.ndarray, *, chunk_size: int | None = None) -> np.ndarray:
    """||u_i|| of every row, in float64, accumulated over column blocks."""
    u = as_vectors(updates)
    squares = np.zeros(u.shape[0], dtype=np.float64)
    for block in column_blocks(u, chunk_size):
        squares += np.einsum("ij,ij->i", block, block)
    return np.sqrt(squares)


def max_update_norm(updates: np.ndarray, *, chunk_size: int | None = None) -> float:
    """max_i ||Delta theta_i||: the epsilon_2 quantity (Eq. 33; Alg. 5 line 16)."""
    norms = update_norms(updates, chunk_size=chunk_size)
    if len(norms) == 0:
        raise ValueError("max_update_norm needs at least one update")
    return float(norms.max())


def mean_update_norm(updates: np.ndarray, weights: np.ndarray | None = None, *,
                     chunk_size: int | None = None) -> float:
    """|| sum_i w_i Delta theta_i / sum_i w_i ||: the epsilon_1 quantity (Eq. 32; Alg. 5 line 16).

    The weights are normalised exactly as FedAvg's aggregation normalises them
    (``clusterfed.algorithms.aggregate.weighted_mean``): pass the sample counts |D_i| for the
    |D_i|/|D_c| weighting of Alg. 2 and Eq. 32, or None (equal weights) for the 1/|c| mean of
    Alg. 5 and Eq. 46. Spec A1: use the weighting that the cluster's aggregation uses.
    """
    u = as_vectors(updates)
    m = u.shape[0]
    if m == 0:
        raise ValueError("mean_update_norm needs at least one update")
    w = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (m,):
        raise ValueError(f"weights must have one entry per update ({m}), got shape {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be finite, non-negative and not all zero")
    w = w / w.sum()
    square = 0.0
    for block in column_blocks(u, chunk_size):
        mean_block = w @ block
        square += float(mean_block @ mean_block)
    return float(np.sqrt(square))


# --------------------------------------------------------------------------------------------
# Split criteria: epsilon_1 / epsilon_2 (Alg. 5 line 16) and the scale-free rule of spec A2
# --------------------------------------------------------------------------------------------


def norm_split_test(mean_norm: float, max_norm: float, eps1: float, eps2: float) -> bool:
    """Alg. 5 line 16: ||Delta theta_c|| < eps1 and max_i ||Delta theta_i|| > eps2.

    Both comparisons are strict, as in Alg. 5 (Alg. 3 line 6 writes max >= eps2; the two differ
    only at exact equality).
    """
    if eps1 <= 0 or eps2 <= 0:
        raise ValueError("eps1 and eps2 must be positive")
    return bool(mean_norm < eps1 and max_norm > eps2)


def max_norm_stagnates(max_norm_history: Sequence[float] | np.ndarray, window: int = 5,
                       tolerance: float = 0.1) -> bool:
    """Whether the largest client update norm has stopped falling (spec A2, Fig. 7).

    History is oldest first, one entry per round. True iff there are at least window + 1 entries
    and the latest is at least (1 - tolerance) times the entry `window` rounds earlier: at a
    stationary point of congruent clients the max norm keeps shrinking with the mean norm, while
    for incongruent clients it "stagnates and even increases" (Section VI-B). The window and the
    tolerance are this project's choice; the paper gives no numbers.
    """
    history = np.asarray(max_norm_history, dtype=np.float64)
    if window < 1 or not 0.0 <= tolerance < 1.0:
        raise ValueError("window must be at least 1 and tolerance in [0, 1)")
    if history.ndim != 1 or len(history) < window + 1:
        return False
    return bool(history[-1] >= (1.0 - tolerance) * history[-1 - window])


def scale_free_split_test(mean_norm: float, max_norm_history: Sequence[float] | np.ndarray,
                          ratio: float = 0.25, window: int = 5, tolerance: float = 0.1) -> bool:
    """Spec A2's scale-free replacement of eps1/eps2: mean/max < ratio and the max stagnates.

    `max_norm_history` ends with this round's max norm. ratio = 0.25 is the authors' code's
    eps1/eps2 = 0.4/1.6; both norms scale alike with the learning rate, the number of local steps
    and sum-versus-mean losses, so their ratio does not. A zero max norm (every client at its own
    stationary point) never splits.
    """
    history = np.asarray(max_norm_history, dtype=np.float64)
    if ratio <= 0:
        raise ValueError("ratio must be positive")
    if history.ndim != 1 or len(history) == 0 or history[-1] <= 0:
        return False
    return bool(mean_norm / history[-1] < ratio
                and max_norm_stagnates(history, window=window, tolerance=tolerance))


# --------------------------------------------------------------------------------------------
# The gamma_max test (the bipartition, its cross similarity and the separation gap are
# `clustering/bipartition.py`)
# --------------------------------------------------------------------------------------------


def gamma_max(alpha_cross_max: float) -> float:
    """sqrt((1 - alpha_cross^max) / 2): Eq. 39's right-hand side.

    The largest noise bound gamma_max under which the separation theorem still guarantees that a
    bipartition with this cross similarity is correct (Eqs. 37-39: alpha_intra^min >= 1 - 2
    gamma_max^2, so alpha_intra^min > alpha_cross^max as soon as gamma_max is below it).
    alpha is clipped to [-1, 1] first, so rounding above 1 gives 0 and not NaN.
    """
    alpha = min(max(float(alpha_cross_max), -1.0), 1.0)
    return float(np.sqrt((1.0 - alpha) / 2.0))


def split_is_admissible(alpha_cross_max: float, gamma_max_threshold: float) -> bool:
    """Eq. 39 / Alg. 3 line 6 / Alg. 5 line 21: accept iff gamma_max < sqrt((1 - alpha) / 2).

    `gamma_max_threshold` is the user's hyper-parameter (the assumed bound on the clients'
    relative gradient noise, in [0, 1)); it is compared, strictly, with :func:`gamma_max` of the
    bipartition's alpha_cross^max. Equivalently alpha_cross^max < 1 - 2 gamma_max^2. A threshold
    of 0 accepts every split except one whose cross similarity is 1.
    """
    if not 0.0 <= gamma_max_threshold <= 1.0:
        raise ValueError(f"gamma_max must lie in [0, 1], got {gamma_max_threshold}")
    return bool(gamma_max_threshold < gamma_max(alpha_cross_max))


def nearest_own_side(similarity: np.ndarray, part_a: np.ndarray, part_b: np.ndarray
                     ) -> np.ndarray:
    """s_i: each client's highest similarity to another member of its own side of a
    bipartition, in position order; -1 for a client alone on its side (no evidence)."""
    s = np.asarray(similarity, dtype=np.float64)
    a, b = checked_parts(s.shape[0], part_a, part_b)
    out = np.full(s.shape[0], -1.0)
    for part in (a, b):
        if len(part) > 1:
            block = s[np.ix_(part, part)].copy()
            np.fill_diagonal(block, -np.inf)
            out[part] = block.max(axis=1)
    return out


def estimated_gamma(similarity: np.ndarray, part_a: np.ndarray, part_b: np.ndarray) -> float:
    """gamma_hat = sqrt((1 - min_i s_i) / 2): the noise level Eq. 38 implies from the data.

    Eq. 38 bounds the within-distribution similarity by alpha_intra^min >= 1 - 2 gamma^2; here
    alpha_intra^min is estimated by the weakest nearest-own-side similarity
    (:func:`nearest_own_side`), which, unlike the all-pairs minimum, stays high on a side that
    still holds several distributions to be split later. A one-client side gives gamma_hat = 1.
    """
    s_min = float(nearest_own_side(similarity, part_a, part_b).min())
    return float(np.sqrt((1.0 - min(max(s_min, -1.0), 1.0)) / 2.0))


def split_is_separated(similarity: np.ndarray, part_a: np.ndarray, part_b: np.ndarray,
                       ratio: float) -> bool:
    """Accept a bipartition iff gamma_hat < ratio * sqrt((1 - alpha_cross^max) / 2).

    Eq. 39 with the noise bound estimated from the similarities themselves instead of assumed:
    with ratio = 1 this only says the sides are more alike inside than across, which the
    optimal bipartition always satisfies (each side's spanning-tree edges are at least as
    strong as the cut edge); ratio < 1 asks for a margin, in the same units as Eq. 39.
    Equivalently (s_min - alpha_cross^max) / (1 - alpha_cross^max) > 1 - ratio^2: a relative
    separation gap (Def. 2) with alpha_intra^min estimated, free of any scale.
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio must lie in (0, 1], got {ratio}")
    bound = gamma_max(alpha_cross_max(similarity, part_a, part_b))
    return bool(estimated_gamma(similarity, part_a, part_b) < ratio * bound)


def centred_similarity(similarity: np.ndarray) -> np.ndarray:
    """Cosine similarities of the clients' unit update directions after removing their mean.

    A cosine matrix is the Gram matrix of unit vectors; centring it (H S H, H = I - 11^T / m)
    and renormalising gives the cosines of those directions minus their mean: the clients of
    a child cluster as seen from its own stationary point (there the members' gradients sum to
    zero), to first order, without training it there first. A client at the mean gets 0."""
    s = np.asarray(similarity, dtype=np.float64)
    m = len(s)
    h = np.eye(m) - np.full((m, m), 1.0 / m)
    centred = h @ s @ h
    scale = np.sqrt(np.clip(np.diag(centred), 0.0, None))
    scale[scale < 1e-12] = np.inf
    out = centred / scale[:, None] / scale[None, :]
    np.fill_diagonal(out, 1.0)
    return np.clip(out, -1.0, 1.0)


def bipartitions_nest(members: np.ndarray, side_a: np.ndarray, side_b: np.ndarray) -> bool:
    """Whether two bipartitions of `members`, each given by one side (client ids), nest: some
    side of one and some side of the other are disjoint, as for any two cuts of one tree of
    groups (cutting off group 1, then group 4, of groups 1-4); random cuts cross."""
    a = np.isin(members, side_a)
    b = np.isin(members, side_b)
    return bool(not (a & b).any() or not (a & ~b).any() or not (~a & b).any()
                or not (~a & ~b).any())


def noise_coupling(gamma_i: np.ndarray | float, gamma_j: np.ndarray | float) -> np.ndarray:
    """H_ij = -gamma_i gamma_j + sqrt(1 - gamma_i^2) sqrt(1 - gamma_j^2) (Eq. 20), gamma in [0, 1].

    Lemma 2: two clients of one distribution with relative noise gamma_i, gamma_j have
    alpha_ij >= H_ij; H = cos(asin gamma_i + asin gamma_j) >= 1 - 2 max(gamma)^2 (Eq. 38).
    """
    gi = np.asarray(gamma_i, dtype=np.float64)
    gj = np.asarray(gamma_j, dtype=np.float64)
    return -gi * gj + np.sqrt(1.0 - gi**2) * np.sqrt(1.0 - gj**2)


def cross_similarity_bound(h: float, k: int) -> float:
    """Theorem 1's bound on alpha_cross^max for k distributions (Eq. 19).

    cos(pi/(k-1)) H + sin(pi/(k-1)) sqrt(1 - H^2) = cos(pi/(k-1) - arccos H) if H >= cos(pi/(k-1)),
    else 1. It falls as H grows, so the smallest H of the population gives a valid bound.
    """
    if k < 2:
        raise ValueError("the separation theorem needs k >= 2 distributions")
    h = min(max(float(h), -1.0), 1.0)
    angle = np.pi / (k - 1)
    if h < np.cos(angle):
        return 1.0
    return float(np.cos(angle) * h + np.sin(angle) * np.sqrt(1.0 - h * h))


# --------------------------------------------------------------------------------------------
# Positions in a sub-matrix -> client ids
# --------------------------------------------------------------------------------------------


def map_to_clients(member_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The client ids at `positions` of a cluster whose members are `member_ids`, in that order.

    The bipartition of cluster c is computed on similarity[np.ix_(c, c)], so its positions p
    mean clients c[p]; using p as ids (the authors' notebook) is right only at the root.
    """
    ids = np.asarray(member_ids).ravel()
    pos = np.asarray(positions)
    if pos.size == 0:
        return ids[:0]
    if pos.ndim != 1 or not np.issubdtype(pos.dtype, np.integer):
        raise ValueError("positions must be a 1-d array of integers")
    if pos.min() < 0 or pos.max() >= len(ids):
        raise ValueError(f"positions must lie in [0, {len(ids)})")
    return ids[pos]
