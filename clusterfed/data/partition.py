"""Label-distribution mathematics for scenarios: pure functions of arrays and a generator.

A partition is described by a *count matrix*: `counts[i, j]` samples of class `classes[j]` go
to client `i`. The functions here compute such matrices (NIID-Bench's label skew and
Dirichlet, McMahan's shards, test shares that follow a client's training histogram) and hand
out disjoint sample indices according to one (`take_by_counts`). Nothing here knows about
datasets, transforms or configs; infeasible requests raise a ConfigError naming the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clusterfed.errors import ConfigError


def split_sizes(total: int, weights: np.ndarray | Sequence[float], minimum: int = 0
                ) -> np.ndarray:
    """Split `total` into integer parts proportional to `weights`, each at least `minimum`.

    The minimum is reserved first, the rest is shared by largest remainder, so the parts sum
    to exactly `total` (an exhaustive `np.array_split` when the weights are equal).
    """
    w = np.asarray(weights, dtype=np.float64)
    n = len(w)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if total < minimum * n:
        raise ConfigError(f"cannot split {total} samples into {n} parts of at least {minimum}")
    if (w < 0).any() or not np.isfinite(w).all():
        raise ValueError("weights must be finite and non-negative")
    rest = total - minimum * n
    if w.sum() <= 0:
        w = np.ones(n)
    exact = rest * w / w.sum()
    sizes = np.floor(exact).astype(np.int64)
    short = rest - int(sizes.sum())
    if short > 0:
        # Largest remainders first; a stable sort breaks ties by position, so it is deterministic.
        order = np.argsort(-(exact - sizes), kind="stable")
        sizes[order[:short]] += 1
    return sizes + minimum


def lognormal_weights(n: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Relative client sizes for quantity skew: exp(N(0, sigma^2)), one per client."""
    return rng.lognormal(mean=0.0, sigma=sigma, size=n)


def class_sizes(labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """How many samples of each of `classes` the label array holds."""
    return np.array([int((labels == c).sum()) for c in classes], dtype=np.int64)


def take_by_counts(labels: np.ndarray, counts: np.ndarray, classes: np.ndarray,
                   rng: np.random.Generator, what: str = "train") -> list[np.ndarray]:
    """Disjoint positions into `labels`: row i gets counts[i, j] random samples of classes[j].

    Each class's positions are shuffled once and cut into consecutive blocks in client order,
    as NIID-Bench hands out its splits.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n_clients = counts.shape[0]
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for j, c in enumerate(classes):
        pos = np.flatnonzero(labels == c)
        need = int(counts[:, j].sum())
        if need > len(pos):
            raise ConfigError(
                f"not enough {what} samples of label {int(c)}: the clients need {need}, "
                f"the data have {len(pos)} (lower samples_per_client or use fewer clients)"
            )
        pos = rng.permutation(pos)
        ends = np.cumsum(counts[:, j])
        starts = ends - counts[:, j]
        for i in range(n_clients):
            if counts[i, j]:
                parts[i].append(pos[starts[i]:ends[i]])
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]


def random_label_sets(n_clients: int, classes: np.ndarray, k: int, rng: np.random.Generator
                      ) -> list[np.ndarray]:
    """NIID-Bench's `#label{k}`: client i owns classes[i mod K] plus k-1 other random classes.

    The first label cycles so that every class is owned once there are at least K clients.
    """
    n = len(classes)
    if not 1 <= k <= n:
        raise ConfigError(f"each client must hold between 1 and {n} labels, got {k}")
    sets = []
    for i in range(n_clients):
        first = i % n
        others = rng.choice(np.delete(np.arange(n), first), size=k - 1, replace=False)
        sets.append(np.sort(classes[np.concatenate([[first], others]).astype(np.int64)]))
    return sets


def window_label_sets(order: np.ndarray, groups: int, per_group: int, overlap: int
                      ) -> list[np.ndarray]:
    """Group j holds `per_group` consecutive labels of `order` starting at j*(per_group-overlap).

    Consecutive groups share `overlap` labels; with overlap 0 the groups are disjoint.
    """
    n = len(order)
    if per_group < 1 or overlap < 0 or overlap >= per_group:
        raise ConfigError(f"labels per group must be at least 1 and overlap in 0..{per_group - 1}"
                          f", got {per_group} and {overlap}")
    step = per_group - overlap
    if (groups - 1) * step + per_group > n:
        raise ConfigError(
            f"{groups} groups of {per_group} labels overlapping by {overlap} need "
            f"{(groups - 1) * step + per_group} labels; the data have {n}"
        )
    return [np.sort(order[j * step:j * step + per_group]) for j in range(groups)]


def cyclic_label_sets(starts: Sequence[int], classes: np.ndarray, per_client: int
                      ) -> list[np.ndarray]:
    """FedProx's FEMNIST rule: a client starting at s holds classes s, s+1, ... (mod K)."""
    n = len(classes)
    if not 1 <= per_client <= n:
        raise ConfigError(f"classes_per_client must be in 1..{n}, got {per_client}")
    return [classes[(s + np.arange(per_client)) % n] for s in starts]


def label_set_counts(label_sets: Sequence[np.ndarray], classes: np.ndarray, sizes: np.ndarray,
                     weights: np.ndarray | None = None, totals: np.ndarray | None = None
                     ) -> np.ndarray:
    """Counts for clients that each own a set of labels.

    Without `totals` (NIID-Bench), all `sizes[j]` samples of class j are split among the clients
    owning it, in proportion to `weights` (equal if None). With `totals`, client i takes
    totals[i] samples split evenly over its own labels (MIX-4: 500 per client, 50 per class).
    """
    n = len(label_sets)
    col = {int(c): j for j, c in enumerate(classes)}
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    counts = np.zeros((n, len(classes)), dtype=np.int64)
    if totals is None:
        owners: list[list[int]] = [[] for _ in classes]
        for i, labels in enumerate(label_sets):
            for c in labels:
                owners[col[int(c)]].append(i)
        for j, members in enumerate(owners):
            if members:
                counts[members, j] = split_sizes(int(sizes[j]), w[members])
        return counts
    for i, labels in enumerate(label_sets):
        cols = [col[int(c)] for c in labels]
        counts[i, cols] = split_sizes(int(totals[i]), np.ones(len(cols)))
    return counts


def dirichlet_counts(sizes: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator,
                     *, min_size: int = 10, weights: np.ndarray | None = None,
                     max_tries: int = 1000) -> tuple[np.ndarray, int]:
    """NIID-Bench's `noniid-labeldir`: per class, proportions p ~ Dir(alpha) over the clients.

    A client already holding at least its fair share (n / N, or its quantity-skew share) gets
    no more of later classes (the balance trick). The whole draw is repeated until every client
    has at least `min_size` samples. Returns the counts and the number of draws it took.

    Where no draw in `max_tries` gets there (a quantity-skewed client whose fair share is a few
    samples), the last draw's short clients are topped up (`top_up`) and the draws returned are
    max_tries + 1, so a federation NIID-Bench's rule can build is the same, and one it cannot is
    still built.
    """
    if alpha <= 0:
        raise ConfigError(f"the Dirichlet alpha must be > 0, got {alpha}")
    total = int(sizes.sum())
    if min_size * n_clients > total:
        raise ConfigError(
            f"dirichlet min_size={min_size} for {n_clients} clients needs {min_size * n_clients}"
            f" samples; the data have {total} (lower min_size or use fewer clients)"
        )
    w = np.ones(n_clients) if weights is None else np.asarray(weights, dtype=np.float64)
    fair = total * w / w.sum()
    counts = np.zeros((n_clients, len(sizes)), dtype=np.int64)
    for attempt in range(1, max_tries + 1):
        counts = np.zeros((n_clients, len(sizes)), dtype=np.int64)
        held = np.zeros(n_clients, dtype=np.int64)
        for j, n_j in enumerate(sizes):
            p = rng.dirichlet(np.full(n_clients, alpha)) * w
            open_ = held < fair
            if (p * open_).sum() > 0:
                p = p * open_
            p = p / p.sum()
            cuts = (np.cumsum(p) * n_j).astype(np.int64)[:-1]
            counts[:, j] = np.diff(np.concatenate([[0], cuts, [n_j]]))
            held += counts[:, j]
        if held.min() >= min_size:
            return counts, attempt
    return top_up(counts, min_size), max_tries + 1


def top_up(counts: np.ndarray, min_size: int) -> np.ndarray:
    """Counts (clients x classes) with every client at `min_size` or more: the client with the
    fewest samples takes one of the richest client's most plentiful class, until none is short
    (each class's total kept; the rich keep their label skew, the short gain some of it)."""
    counts = counts.copy()
    held = counts.sum(axis=1)
    while held.min() < min_size:
        poor, rich = int(np.argmin(held)), int(np.argmax(held))
        label = int(np.argmax(counts[rich]))
        counts[rich, label] -= 1
        counts[poor, label] += 1
        held[rich] -= 1
        held[poor] += 1
    return counts


def shard_partition(labels: np.ndarray, n_clients: int, shards_per_client: int,
                    rng: np.random.Generator, weights: np.ndarray | None = None
                    ) -> tuple[list[np.ndarray], int]:
    """McMahan's pathological split: sort by label, cut shards, give each client some at random.

    There are n_clients * shards_per_client shards of n // shards samples (the remainder is
    left out); with quantity-skew `weights`, a shard's size follows its owner's weight instead.
    Returns each client's positions into `labels` and the (equal) shard size, 0 when skewed.
    """
    n_shards = n_clients * shards_per_client
    if shards_per_client < 1 or n_shards > len(labels):
        raise ConfigError(f"cannot cut {len(labels)} samples into {n_clients} clients x "
                          f"{shards_per_client} shards")
    order = rng.permutation(len(labels))
    # A stable sort keeps the random order inside each label.
    by_label = order[np.argsort(labels[order], kind="stable")]
    owner = np.empty(n_shards, dtype=np.int64)
    owner[rng.permutation(n_shards)] = np.repeat(np.arange(n_clients), shards_per_client)
    if weights is None:
        size = len(labels) // n_shards
        lengths = np.full(n_shards, size, dtype=np.int64)
    else:
        size = 0
        lengths = split_sizes(len(labels), np.asarray(weights, dtype=np.float64)[owner], 1)
    ends = np.cumsum(lengths)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for s in range(n_shards):
        parts[owner[s]].append(by_label[ends[s] - lengths[s]:ends[s]])
    return [np.sort(np.concatenate(p)) for p in parts], size


def matched_test_counts(train_counts: np.ndarray, test_sizes: np.ndarray,
                        per_client: int | None = None) -> np.ndarray:
    """Test counts that follow each client's training label histogram, disjoint across clients.

    Without `per_client`, each class's test samples are split among the clients in proportion
    to how many training samples of it they hold (classes no client holds stay unused). With
    `per_client`, client i gets that many, spread over labels like its training data.
    """
    train_counts = np.asarray(train_counts, dtype=np.int64)
    counts = np.zeros_like(train_counts)
    if per_client is None:
        for j, n_j in enumerate(test_sizes):
            if train_counts[:, j].sum() > 0:
                counts[:, j] = split_sizes(int(n_j), train_counts[:, j])
        return counts
    for i, row in enumerate(train_counts):
        if row.sum() > 0:
            counts[i] = split_sizes(per_client, row)
    return counts
