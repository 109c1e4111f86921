"""Gram and cosine matrices of many long vectors (client updates, gradients, models).

Every product is accumulated in float64 over column blocks, so a float32 matrix of 100 clients by
1.7M parameters is never copied whole, and the results are symmetric bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

# Columns per block: a float64 block of m rows stays near this many bytes.
BLOCK_BYTES = 32 * 2**20


def as_vectors(vectors: np.ndarray) -> np.ndarray:
    """The (m, d) matrix of flat vectors, as given (no copy); rejects anything else."""
    array = np.asarray(vectors)
    if array.ndim != 2:
        raise ValueError(f"vectors must be an (m, d) matrix, got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"vectors must be real numbers, got dtype {array.dtype}")
    return array


def column_blocks(vectors: np.ndarray, chunk_size: int | None = None) -> Iterator[np.ndarray]:
    """float64 copies of consecutive column blocks, each checked to be finite.

    `chunk_size` is the number of columns per block (default: blocks of about BLOCK_BYTES).
    """
    m, d = vectors.shape
    if chunk_size is None:
        chunk_size = max(1, BLOCK_BYTES // (8 * max(m, 1)))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    for start in range(0, d, chunk_size):
        block = np.asarray(vectors[:, start:start + chunk_size], dtype=np.float64)
        if not np.isfinite(block).all():
            raise ValueError("vectors contain NaN or infinite values")
        yield block


def gram_matrix(vectors: np.ndarray, *, centre: bool = False, chunk_size: int | None = None
                ) -> np.ndarray:
    """G = V V^T in float64, accumulated over column blocks of V; exactly symmetric.

    `centre`: the Gram matrix of the rows less their mean, centred in float64 block by block.
    """
    v = as_vectors(vectors)
    m = v.shape[0]
    gram = np.zeros((m, m), dtype=np.float64)
    for block in column_blocks(v, chunk_size):
        if centre:
            block = block - block.mean(axis=0)   # a new array: the block may view V itself
        gram += block @ block.T
    return (gram + gram.T) / 2.0  # a + b == b + a exactly: the result is symmetric bit for bit


def cosine_similarity_matrix(vectors: np.ndarray, *, zero_self: float = 0.0,
                             chunk_size: int | None = None) -> np.ndarray:
    """alpha_ij = <v_i, v_j> / (||v_i|| ||v_j||) for all rows of an (m, d) matrix.

    Zero rows: a zero vector has no direction, so its cosine with every other row is 0 (the
    convention of ``sklearn.metrics.pairwise.cosine_similarity``). `zero_self` is the rule for
    its cosine with itself: 0 for a similarity (sklearn's, and CFL's, whose authors get it from
    a 1e-12 in the denominator), 1 where the matrix becomes a distance 1 - alpha, so that every
    vector is at distance 0 from itself. Every other diagonal entry is exactly 1. Values are
    clipped to [-1, 1] and the matrix is exactly symmetric.
    """
    return cosine_from_gram(gram_matrix(vectors, chunk_size=chunk_size), zero_self=zero_self)


def cosine_from_gram(gram: np.ndarray, *, zero_self: float = 0.0) -> np.ndarray:
    """The cosine matrix of the vectors whose (exactly symmetric) Gram matrix is `gram`, by
    `cosine_similarity_matrix`'s conventions."""
    norms = np.sqrt(np.diag(gram))
    nonzero = norms > 0
    inverse = np.zeros_like(norms)
    inverse[nonzero] = 1.0 / norms[nonzero]
    # outer(inv, inv) is symmetric bit for bit, so the product keeps the Gram matrix's symmetry.
    similarity = np.clip(gram * np.outer(inverse, inverse), -1.0, 1.0)
    np.fill_diagonal(similarity, np.where(nonzero, 1.0, float(zero_self)))
    return similarity


def gram_rows(vectors: np.ndarray, rows: np.ndarray, *, chunk_size: int | None = None
              ) -> np.ndarray:
    """G[rows, :] of `gram_matrix(vectors)`: the given rows against all, (len(rows), m), in
    float64 over column blocks; p m d work where the whole matrix is m^2 d."""
    v = as_vectors(vectors)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros((len(rows), v.shape[0]), dtype=np.float64)
    for block in column_blocks(v, chunk_size):
        out += block[rows] @ block.T
    return out


def update_gram(gram: np.ndarray, vectors: np.ndarray, rows: np.ndarray, *,
                chunk_size: int | None = None) -> np.ndarray:
    """A new Gram matrix of `vectors` where only `rows` changed since `gram` was theirs: the
    changed rows and columns recomputed, exactly symmetric, `gram` left as it was."""
    rows = np.unique(np.asarray(rows, dtype=np.int64))
    fresh = gram_rows(vectors, rows, chunk_size=chunk_size)
    among = fresh[:, rows]
    fresh[:, rows] = (among + among.T) / 2.0   # the changed rows among themselves, symmetric
    out = gram.copy()
    out[rows, :] = fresh
    out[:, rows] = fresh.T
    return out


def cosine_distance_matrix(vectors: np.ndarray, *, chunk_size: int | None = None) -> np.ndarray:
    """1 - cos in [0, 2] with a zero diagonal; a zero vector is at distance 1 from all others."""
    return 1.0 - cosine_similarity_matrix(vectors, zero_self=1.0, chunk_size=chunk_size)


def euclidean_distance_matrix(vectors: np.ndarray, *, chunk_size: int | None = None
                              ) -> np.ndarray:
    """||v_i - v_j||_2 for all rows, from one Gram matrix; zero diagonal, exactly symmetric.

    The rows are centred first (distances do not change): the identity
    ||a - b||^2 = |a|^2 + |b|^2 - 2 a.b then cancels little even for nearby vectors.
    """
    gram = gram_matrix(vectors, centre=True, chunk_size=chunk_size)
    sq = np.diag(gram)
    distance = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0))
    np.fill_diagonal(distance, 0.0)
    return distance
