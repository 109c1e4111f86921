"""How well found clusters match the true ones, and the figures of a record per true cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from clusterfed.clustering.precomputed import first_appearance_labels

# A client's true cluster where none is known (a real federation, own data): every client -1.
NO_TRUTH = -1


def has_truth(true: np.ndarray) -> bool:
    """Whether a federation's true clusters are known (no client is NO_TRUTH)."""
    true = np.asarray(true)
    return bool(true.size) and bool((true != NO_TRUTH).all())


def contingency(true: np.ndarray, found: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts of clients per (true cluster, found cluster), with the row and column labels."""
    true_ids, t = np.unique(true, return_inverse=True)
    found_ids, f = np.unique(found, return_inverse=True)
    table = np.zeros((len(true_ids), len(found_ids)), dtype=np.int64)
    np.add.at(table, (t, f), 1)
    return table, true_ids, found_ids


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two labelings split the points alike, whatever the labels' names."""
    return len(a) == len(b) and bool(np.array_equal(first_appearance_labels(np.asarray(a)),
                                                    first_appearance_labels(np.asarray(b))))


def clustering_scores(true: np.ndarray, found: np.ndarray) -> dict[str, float]:
    """Adjusted Rand index and normalised mutual information of a clustering against the truth."""
    # Imported here: scikit-learn costs a Flower node about 0.8 s of CPU per process start.
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    return {
        "ari": float(adjusted_rand_score(true, found)),
        "nmi": float(normalized_mutual_info_score(true, found)),
    }


def truth_scores(true: np.ndarray, found: np.ndarray) -> dict[str, float | None]:
    """`clustering_scores`, or None for each where the truth is unknown.

    Scoring against all-NO_TRUTH labels would read as a perfect (or a zero) score: made up.
    """
    if not has_truth(true):
        return {"ari": None, "nmi": None}
    return dict(clustering_scores(true, found))


def evaluated_mean(values: np.ndarray) -> float:
    """The mean over the clients evaluated (NaN: a client a remote runtime could not reach, or
    one without test data)."""
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if len(kept) else float("nan")


def truth_figures(accuracy: np.ndarray, found: np.ndarray, true_clusters: np.ndarray
                  ) -> dict[str, Any]:
    """The figures of a record that need the true clusters: ARI, NMI and the mean accuracy
    of each true cluster; each None where the truth is unknown (own data)."""
    per_true = None
    if has_truth(true_clusters):
        per_true = {str(int(k)): evaluated_mean(accuracy[true_clusters == k])
                    for k in np.unique(true_clusters)}
    return {"per_true_cluster_accuracy": per_true, **truth_scores(true_clusters, found)}


def grouping_scores(groupings: Mapping[str, np.ndarray], found: np.ndarray) -> dict[str, Any]:
    """`{"groupings": {name: {ari, nmi}}}` against each further true grouping of a federation
    (a corruption, noisy labels), or nothing where it has none, so other summaries keep
    their keys."""
    if not groupings:
        return {}
    return {"groupings": {name: truth_scores(np.asarray(g), found)
                          for name, g in groupings.items()}}


def shares_error(true_shares: np.ndarray, estimated: np.ndarray) -> float:
    """Mean total-variation distance between each client's true source shares (n, S) and the
    weights a method puts on its models (n, K; rows normalised to sum 1), with models matched
    one-to-one to sources by the matching that fits best. A source or a model left unmatched
    counts against a zero column. 0: every client's mixture recovered; a hard clustering that
    finds each client's dominant source scores the mean minority share."""
    # scipy's Hungarian solver finds the best of the max(S, K)! matchings.
    from scipy.optimize import linear_sum_assignment

    t = np.asarray(true_shares, dtype=np.float64)
    e = np.asarray(estimated, dtype=np.float64)
    if t.ndim != 2 or e.ndim != 2 or len(t) != len(e) or not len(t):
        raise ValueError(f"shares are (clients, sources) and (clients, models) with the same "
                         f"clients, got {t.shape} and {e.shape}")
    e = e / e.sum(axis=1, keepdims=True)
    size = max(t.shape[1], e.shape[1])
    t = np.pad(t, ((0, 0), (0, size - t.shape[1])))
    e = np.pad(e, ((0, 0), (0, size - e.shape[1])))
    cost = np.abs(t[:, :, None] - e[:, None, :]).sum(axis=0)   # (source, model)
    rows, cols = linear_sum_assignment(cost)
    return float(0.5 * cost[rows, cols].sum() / len(t))


def one_hot(assignment: np.ndarray, k: int) -> np.ndarray:
    """(n, k) rows with a 1 at each client's model: a hard assignment as weights."""
    out = np.zeros((len(assignment), k))
    out[np.arange(len(assignment)), np.asarray(assignment, dtype=np.int64)] = 1.0
    return out


def score_text(value: float | None, digits: int = 3) -> str:
    """A score as printed in tables and result lines: 'n/a' where there is no truth."""
    return "n/a" if value is None else f"{value:.{digits}f}"
