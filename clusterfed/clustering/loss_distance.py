"""LCFL's dissimilarities between clients (Gu et al., lcfl.md 2.1, 2.7), as pure functions.

`loss_matrix[i, j] = L_i(w_j)`: the mean loss of client j's model on client i's data. Client i
computes its half of Eq. 2 from its own row only (`half_row`), the server adds the halves
(`assemble`); `loss_distance` is the same computation done centrally. DiffNorm and GradCos are
the paper's Section V-A ablations.
"""

from __future__ import annotations

import numpy as np

CHUNK_ROWS = 256   # rows per block of a Gram matrix: bounds memory to CHUNK_ROWS x n floats


def half_row(losses: np.ndarray, own: int) -> np.ndarray:
    """Client i's half of Eq. 2: |L_i(w_j) - L_i(w_i)| for every j (Alg. 1, line 8).

    `losses[j] = L_i(w_j)`, `own = i`; the entry for j = i is 0.
    """
    losses = np.asarray(losses, dtype=np.float64)
    return np.abs(losses - losses[own])


def assemble(halves: np.ndarray) -> np.ndarray:
    """The server's d(i, j) = h(i, j) + h(j, i) from the clients' rows (Alg. 1, line 14)."""
    h = np.asarray(halves, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise ValueError(f"the half-distance rows must form a square matrix, got {h.shape}")
    d = h + h.T
    np.fill_diagonal(d, 0.0)
    return d


def loss_distance(loss_matrix: np.ndarray) -> np.ndarray:
    """Eq. 2 for all pairs at once: d(i,j) = |L_i(w_i) - L_i(w_j)| + |L_j(w_i) - L_j(w_j)|."""
    lmat = np.asarray(loss_matrix, dtype=np.float64)
    if lmat.ndim != 2 or lmat.shape[0] != lmat.shape[1]:
        raise ValueError(f"the loss matrix must be square (M x M), got {lmat.shape}")
    return assemble(np.abs(lmat - np.diag(lmat)[:, None]))


def eq6_distance(loss_matrix: np.ndarray) -> np.ndarray:
    """The rejected alternative (Eq. 6): |L_i(w_i) - L_j(w_i)| + |L_i(w_j) - L_j(w_j)|.

    It compares two clients' losses under the same model, so clients must send their raw
    losses L_i(w_j) (one more message than Eq. 2's halves, which is why the paper rejects it).
    """
    lmat = np.asarray(loss_matrix, dtype=np.float64)
    if lmat.ndim != 2 or lmat.shape[0] != lmat.shape[1]:
        raise ValueError(f"the loss matrix must be square (M x M), got {lmat.shape}")
    a = np.abs(np.diag(lmat)[:, None] - lmat.T)   # |L_i(w_i) - L_j(w_i)| at [i, j]
    d = a + a.T                                   # + |L_j(w_j) - L_i(w_j)|
    np.fill_diagonal(d, 0.0)
    return d


def _gram(vectors: np.ndarray) -> np.ndarray:
    """V V^T (float32 products, float64 result), one block of rows at a time."""
    v = np.ascontiguousarray(vectors, dtype=np.float32)
    n = len(v)
    out = np.empty((n, n), dtype=np.float64)
    for start in range(0, n, CHUNK_ROWS):
        out[start:start + CHUNK_ROWS] = v[start:start + CHUNK_ROWS] @ v.T
    return out


def diffnorm_distance(params: np.ndarray) -> np.ndarray:
    """DiffNorm (Eq. 1, [41]): ||w_i - w_j||_2 over all parameters concatenated.

    The vectors are centred first (distances do not change): the Gram identity
    ||a - b||^2 = |a|^2 + |b|^2 - 2 a.b then cancels little even for nearby models.
    """
    p = np.asarray(params, dtype=np.float32)
    gram = _gram(p - p.mean(axis=0, dtype=np.float64).astype(np.float32))
    sq = np.diag(gram)
    d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0))
    np.fill_diagonal(d, 0.0)
    return d


def gradcos_distance(gradients: np.ndarray) -> np.ndarray:
    """GradCos (Sattler et al. [38]): 1 - cos(g_i, g_j); a zero gradient is orthogonal to all."""
    gram = _gram(gradients)
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    norms[norms == 0] = np.inf
    d = 1.0 - gram / norms[:, None] / norms[None, :]
    d = np.clip(d, 0.0, 2.0)
    np.fill_diagonal(d, 0.0)
    return d
