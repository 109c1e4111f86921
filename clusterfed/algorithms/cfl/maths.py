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

from clusterfed.clustering.similarity import as_vectors, column_blocks

# Rows per tile when mirroring a similarity matrix's upper triangle.
_TILE_ROWS = 256


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
# Optimal bipartition (Alg. 1; Eqs. 25/26/35) and complete linkage (the authors' code)
# --------------------------------------------------------------------------------------------


def _square_similarity(similarity: np.ndarray) -> np.ndarray:
    """A float64 copy whose lower triangle mirrors the upper one: the value of pair {i, j} is
    similarity[min(i, j), max(i, j)], whatever rounding made the input slightly asymmetric.

    Worked in tiles of rows: a whole-matrix transpose (``s.T``) walks memory with a stride of
    a full row, which at 10,000 clients cost more than the bipartition itself.
    """
    s = np.asarray(similarity, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != s.shape[1]:
        raise ValueError(f"similarity must be a square matrix, got shape {s.shape}")
    m = s.shape[0]
    if m < 2:
        raise ValueError("a bipartition needs at least 2 clients")
    if not np.isfinite(s).all():
        raise ValueError("similarity contains NaN or infinite values")
    mirrored = np.array(s, dtype=np.float64, copy=True)
    for a in range(0, m, _TILE_ROWS):
        b = min(a + _TILE_ROWS, m)
        upper = s[:b, a:b].T          # (b - a, b): pairs {i, j} with j < b, read as s[j, i]
        rows = s[a:b, :b]
        if np.abs(rows - upper).max() > 1e-9:
            raise ValueError("similarity must be symmetric")
        below = np.tril(np.ones((b - a, b), dtype=bool), a - 1)   # j < i in rows a..b
        mirrored[a:b, :b][below] = upper[below]
    return mirrored


def _two_parts(in_second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions of the part holding position 0, the other positions), both sorted."""
    if in_second[0]:
        in_second = ~in_second
    return np.flatnonzero(~in_second), np.flatnonzero(in_second)


def optimal_bipartition_alg1(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1 (Optimal Bipartition), transcribed line by line; O(m^3). For tests.

    Visit the m^2 entries by decreasing similarity (a stable argsort of -alpha flattened row-major,
    so ties go to the smaller flat index i1 * m + i2), merge the clusters holding i1 and i2, stop
    when two clusters remain. With m = 2 the only bipartition is returned at once: the box checks
    |C| = 2 only after a merge, which for m = 2 could already have joined both clients.
    Returns the part holding position 0 first, each part sorted.
    """
    s = _square_similarity(similarity)
    m = s.shape[0]
    if m == 2:
        return np.array([0]), np.array([1])
    order = np.argsort(-s.ravel(), kind="stable")  # line 1: s <- argsort(-alpha[:])
    clusters: list[frozenset[int]] = [frozenset({i}) for i in range(m)]  # line 2
    for flat in order:  # line 3
        i1, i2 = divmod(int(flat), m)  # line 4
        merged: set[int] = set()  # line 5
        kept = []
        for c in clusters:  # lines 6-9
            if i1 in c or i2 in c:
                merged |= c
            else:
                kept.append(c)
        clusters = [*kept, frozenset(merged)]  # line 10
        if len(clusters) == 2:  # line 11
            in_second = np.zeros(m, dtype=bool)
            in_second[sorted(clusters[1])] = True
            return _two_parts(in_second)
    raise AssertionError("unreachable: Kruskal's merges always pass through two clusters")


def optimal_bipartition(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bipartition minimising the maximum cross similarity (Eq. 25/35), in O(m^2).

    Algorithm 1 is Kruskal's algorithm for the maximum spanning tree of the similarity graph,
    stopped at two components: its answer is that tree without its weakest edge (single linkage
    cut into two clusters). This builds the same tree with Prim's algorithm on the dense matrix.

    Tie-breaking, identical to Algorithm 1's stable sort: edges are ordered by decreasing
    similarity, then by increasing flat index min(i, j) * m + max(i, j). Under that strict order
    the maximum spanning tree is unique, so this function returns exactly Algorithm 1's partition
    (tested), ties included. The value of pair {i, j} is read from the upper triangle.

    Returns (positions of the part holding position 0, the other positions), both sorted.
    Positions index the given matrix; see :func:`map_to_clients`.
    """
    s = _square_similarity(similarity)
    m = s.shape[0]
    positions = np.arange(m)
    in_tree = np.zeros(m, dtype=bool)
    in_tree[0] = True
    # For each vertex outside the tree: its best edge into the tree (weight, flat index, end).
    best_weight = s[0].copy()
    best_flat = positions.copy()  # the flat index of pair {0, u} is u
    parent = np.zeros(m, dtype=np.int64)
    added = [0]
    for _ in range(m - 1):
        outside = ~in_tree
        top = best_weight[outside].max()
        candidates = np.flatnonzero(outside & (best_weight == top))
        v = int(candidates[np.argmin(best_flat[candidates])])
        in_tree[v] = True
        added.append(v)
        row = s[v]
        flat = np.minimum(positions, v) * m + np.maximum(positions, v)
        better = ~in_tree & ((row > best_weight) | ((row == best_weight) & (flat < best_flat)))
        best_weight[better] = row[better]
        best_flat[better] = flat[better]
        parent[better] = v
    # The weakest tree edge: the smallest weight, ties to the largest flat index (the edge that
    # Algorithm 1 would add last). Vertex `cut` is its end farther from the root 0.
    children = np.array(added[1:])
    edge_weight = s[parent[children], children]
    edge_flat = np.minimum(parent[children], children) * m + np.maximum(parent[children], children)
    weakest = np.lexsort((-edge_flat, edge_weight))[0]
    cut = int(children[weakest])
    # The subtree below `cut`: parents are added to the tree before their children.
    in_subtree = np.zeros(m, dtype=bool)
    in_subtree[cut] = True
    for v in added[added.index(cut) + 1:]:
        in_subtree[v] = in_subtree[parent[v]]
    return _two_parts(in_subtree)


def complete_linkage_bipartition(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Agglomerative complete linkage on the distance -alpha, stopped at two clusters.

    What the authors' code does (``AgglomerativeClustering(linkage="complete")`` on -S; spec
    §4.7, A7); it is not Algorithm 1 and can miss the optimum of Eq. 25 (spec §2.1). Merging the
    closest pair of clusters, the distance of a merged cluster to another is the larger of its two
    parts' distances (Lance-Williams). Tie-breaking: among equally close pairs of clusters, the
    pair whose smallest members (a, b), a < b, come first in lexicographic order; a cluster is
    labelled by its smallest member. O(m^3) time, O(m^2) memory.

    Returns (positions of the part holding position 0, the other positions), both sorted.
    """
    s = _square_similarity(similarity)
    m = s.shape[0]
    distance = -s
    np.fill_diagonal(distance, np.inf)
    distance[np.tril_indices(m, -1)] = np.inf  # only pairs a < b are candidates
    label = np.arange(m)
    for _ in range(m - 2):
        a, b = divmod(int(np.argmin(distance)), m)  # first minimum in row-major order
        # d(a u b, k) = max(d(a, k), d(b, k)), kept in the upper triangle of slot a.
        merged = np.maximum(
            np.concatenate([distance[:a, a], distance[a, a:]]),
            np.concatenate([distance[:b, b], distance[b, b:]]),
        )
        distance[:a, a] = merged[:a]
        distance[a, a + 1:] = merged[a + 1:]
        distance[:, b] = np.inf
        distance[b, :] = np.inf
        label[label == b] = a
    return _two_parts(label != 0)


# --------------------------------------------------------------------------------------------
# Cross-cluster similarity, the gamma_max test and the separation gap
# --------------------------------------------------------------------------------------------


def _parts_checked(m: int, part_a: np.ndarray, part_b: np.ndarray) -> tuple[np.ndarray, ...]:
    a = np.asarray(part_a, dtype=np.int64).ravel()
    b = np.asarray(part_b, dtype=np.int64).ravel()
    if len(a) == 0 or len(b) == 0:
        raise ValueError("both parts of a bipartition must be non-empty")
    if min(a.min(), b.min()) < 0 or max(a.max(), b.max()) >= m:
        raise ValueError(f"positions must lie in [0, {m})")
    if np.intersect1d(a, b).size:
        raise ValueError("the two parts must be disjoint")
    return a, b


def alpha_cross_max(similarity: np.ndarray, part_a: np.ndarray, part_b: np.ndarray) -> float:
    """alpha_cross^max = max_{i in c1, j in c2} alpha_ij (Eq. 17/18; Alg. 3 line 5).

    Given the optimal bipartition, this is the min-max value of Eq. 25.
    """
    s = np.asarray(similarity, dtype=np.float64)
    a, b = _parts_checked(s.shape[0], part_a, part_b)
    return float(s[np.ix_(a, b)].max())


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
    a, b = _parts_checked(s.shape[0], part_a, part_b)
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


def intra_similarity_min(similarity: np.ndarray, true_labels: np.ndarray) -> float:
    """alpha_intra^min = min over pairs i != j with I(i) = I(j) of alpha_ij (Eq. 21).

    1.0 when no distribution has two clients (spec A19).
    """
    s = np.asarray(similarity, dtype=np.float64)
    labels = np.asarray(true_labels).ravel()
    if s.ndim != 2 or s.shape[0] != s.shape[1] or len(labels) != s.shape[0]:
        raise ValueError("similarity must be square with one label per row")
    same = labels[:, None] == labels[None, :]
    np.fill_diagonal(same, False)
    return float(s[same].min()) if same.any() else 1.0


def separation_gap(similarity: np.ndarray, true_labels: np.ndarray) -> float:
    """g(alpha) = alpha_intra^min - alpha_cross^max (Def. 2, Eqs. 28/29/48).

    alpha_intra^min uses the true labels (:func:`intra_similarity_min`); alpha_cross^max is the
    min over all bipartitions of the max cross similarity, i.e. the value at Algorithm 1's
    bipartition, which does not look at the labels. g > 0 implies that Algorithm 1's bipartition
    is correct (Corollary 1); the converse does not hold (spec §3.3). Positive is good.
    """
    part_a, part_b = optimal_bipartition(similarity)
    cross = alpha_cross_max(similarity, part_a, part_b)
    return intra_similarity_min(similarity, true_labels) - cross


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
