"""LCFL's dissimilarities between clients (Gu et al., lcfl.md 2.1, 2.7), as pure functions.

`loss_matrix[i, j] = L_i(w_j)`: the mean loss of client j's model on client i's data. Client i
computes its half of Eq. 2 from its own row only (`half_row`), the server adds the halves
(`assemble`); `loss_distance` is the same computation done centrally. DiffNorm and GradCos are
the paper's Section V-A ablations.
"""

from __future__ import annotations

import numpy as np

from clusterfed.clustering.similarity import cosine_distance_matrix, euclidean_distance_matrix


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


def diffnorm_distance(params: np.ndarray) -> np.ndarray:
    """DiffNorm (Eq. 1, [41]): ||w_i - w_j||_2 over all parameters concatenated."""
    return euclidean_distance_matrix(np.asarray(params, dtype=np.float32))


def gradcos_distance(gradients: np.ndarray) -> np.ndarray:
    """GradCos (Sattler et al. [38]): 1 - cos(g_i, g_j); a zero gradient is orthogonal to all."""
    return cosine_distance_matrix(gradients)
