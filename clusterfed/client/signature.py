"""A client's data signature for PACFL (Vahidian, Morafah et al., 2023; spec
../shared/specs/pacfl.md 2.1): the left singular vectors of its data, one truncated SVD per
class or of all its data, computed where the data are; the server compares signatures by
their principal angles (`algorithms/pacfl/principal_angles.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clusterfed.tasks import SVD_METHODS

# Above this many matrix entries, `svd="auto"` uses a randomised truncated SVD.
RANDOMIZED_ABOVE = 20_000_000


def _gram_top(data: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k left singular pairs from the eigenvectors of the smaller Gram matrix.

    Exact up to rounding for the leading vectors, and far cheaper than a full SVD when k is
    small; squaring only loses the directions with sigma_k / sigma_1 below ~1e-7, which the
    rank tolerance drops anyway.
    """
    from scipy.linalg import eigh

    d, n = data.shape
    gram = data.T @ data if n <= d else data @ data.T
    m = len(gram)
    w, v = eigh(gram, subset_by_index=[m - k, m - 1])
    w, v = np.clip(w[::-1], 0.0, None), v[:, ::-1]
    s = np.sqrt(w)
    if n > d:
        return v, s
    safe = np.where(s > 0, s, 1.0)
    return (data @ v) / safe, s


def top_left_singular_vectors(data: np.ndarray, p: int, method: str = "auto",
                              seed: int = 0) -> np.ndarray:
    """The p most significant left singular vectors of `data` (d x n), fewer when its rank is.

    `method`: "exact" (LAPACK SVD), "gram" (eigenvectors of the smaller Gram matrix),
    "randomized" (Halko et al., scikit-learn), "auto" (gram, or randomized for very large
    blocks). Columns for numerically zero singular values are dropped. Each column's sign is
    fixed so that its largest-magnitude entry is positive: SVD signs are arbitrary (spec 7, #24).
    """
    if method not in SVD_METHODS:
        raise ValueError(f"svd must be one of {', '.join(SVD_METHODS)}, got {method!r}")
    if p < 1:
        raise ValueError(f"p must be at least 1, got {p}")
    data = np.asarray(data, dtype=np.float64)
    k = min(p, *data.shape)
    if method == "auto":
        method = ("randomized" if data.size > RANDOMIZED_ABOVE and k < min(data.shape) // 2
                  else "gram")
    if method == "randomized":
        from sklearn.utils.extmath import randomized_svd

        u, s, _ = randomized_svd(data, k, n_oversamples=10, n_iter=7, random_state=seed)
    elif method == "gram":
        u, s = _gram_top(data, k)
    else:
        u, s, _ = np.linalg.svd(data, full_matrices=False)
        u, s = u[:, :k], s[:k]
    tol = (s[0] if len(s) else 0.0) * max(data.shape) * np.finfo(np.float64).eps
    if method == "gram":
        tol = (s[0] if len(s) else 0.0) * np.sqrt(max(data.shape) * np.finfo(np.float64).eps)
    u = u[:, s > tol]
    peak = np.abs(u).argmax(axis=0)
    return u * np.sign(u[peak, np.arange(u.shape[1])])


def budget_allocation(counts: np.ndarray, budget: int) -> np.ndarray:
    """The PACFL code's Dirichlet scheme (spec 2.1): `budget` singular vectors shared among a
    client's classes. A class holding at least 1/(classes) + 0.05 of the samples weighs its
    raw count, any other its share, so dominant classes take nearly all vectors; the shares
    of `budget` are rounded by largest remainders to sum to `budget`."""
    counts = np.asarray(counts, dtype=np.float64)
    ratio = counts / counts.sum()
    weights = np.where(ratio >= 1.0 / len(counts) + 0.05, counts, ratio)
    shares = weights / weights.sum() * budget
    alloc = np.floor(shares).astype(np.int64)
    remainder = np.argsort(-(shares - alloc), kind="stable")[:budget - int(alloc.sum())]
    alloc[remainder] += 1
    return alloc


def client_signature(x: np.ndarray, y: np.ndarray | None = None, *, p: int = 3,
                     per_class: bool = True, center: bool = False,
                     mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                     svd: str = "auto", seed: int = 0, budget: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """A client's signature: (U (d x c), the label of each column).

    `per_class`: one truncated SVD per class held, blocks stacked in ascending label order
    (the authors' code for label skew); else one SVD of all the data (MIX-4). `budget`
    (per-class only): the classes share that many vectors by `budget_allocation` instead of p
    each, a class given none is left out (the code's Dirichlet runs). `mean`/`std`
    normalise each channel first (the code's MIX-4 tensors); `center` subtracts each block's
    mean sample (off in the paper's code). Positive scaling of the data never changes U.
    """
    x = np.asarray(x)
    n = len(x)
    if n == 0:
        raise ValueError("a signature needs at least one sample")
    flat = x.reshape(n, -1).astype(np.float64)
    if mean is not None or std is not None:
        channels = x.shape[1] if x.ndim >= 3 else 1
        m = np.broadcast_to(np.asarray(0.0 if mean is None else mean, dtype=np.float64),
                            (channels,))
        s = np.broadcast_to(np.asarray(1.0 if std is None else std, dtype=np.float64),
                            (channels,))
        flat = ((flat.reshape(n, channels, -1) - m[:, None]) / s[:, None]).reshape(n, -1)
    if per_class:
        if y is None:
            raise ValueError("a per-class signature needs the labels")
        labels = np.unique(y)
        blocks = [flat[np.asarray(y) == c] for c in labels]
    else:
        labels, blocks = np.array([-1]), [flat]
    sizes = [p] * len(blocks)
    if budget is not None and per_class:
        sizes = budget_allocation(np.array([len(b) for b in blocks]), budget).tolist()
    columns, column_labels = [], []
    for label, block, size in zip(labels, blocks, sizes, strict=True):
        if size == 0:
            continue
        data = block.T  # features x samples
        if center:
            data = data - data.mean(axis=1, keepdims=True)
        u = top_left_singular_vectors(data, size, svd, seed)
        columns.append(u)
        column_labels.append(np.full(u.shape[1], int(label), dtype=np.int64))
    return np.hstack(columns), np.concatenate(column_labels)
