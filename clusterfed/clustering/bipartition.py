"""Bipartitions of a similarity matrix, as pure functions: Algorithm 1 of CFL (Sattler, Müller,
Samek), the bipartition that minimises the largest cross similarity, complete linkage's, the
cross similarity of a bipartition and the separation gap against the true clusters.

Equation and algorithm numbers are those of the CFL paper (arXiv 1910.01991v1); "spec" is
``shared/specs/cfl.md``. Positions index the matrix given: for a cluster's sub-matrix, map them
to client ids with `algorithms/cfl/maths.py`'s ``map_to_clients``. The separation gap needs the
true clusters, so the simulator computes it, not an algorithm.
"""

from __future__ import annotations

import numpy as np

# Rows per tile when mirroring a similarity matrix's upper triangle.
_TILE_ROWS = 256


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
# Cross-cluster similarity and the separation gap
# --------------------------------------------------------------------------------------------


def checked_parts(m: int, part_a: np.ndarray, part_b: np.ndarray) -> tuple[np.ndarray, ...]:
    """The two parts as int64 positions, refused unless both are non-empty, disjoint and in
    [0, m)."""
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
    a, b = checked_parts(s.shape[0], part_a, part_b)
    return float(s[np.ix_(a, b)].max())


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
