"""The per-round accuracy record (the protocols themselves: `sim/protocols.py`)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from clusterfed.algorithms.base import ClusterView
from clusterfed.clustering.metrics import evaluated_mean, truth_figures

log = logging.getLogger("clusterfed")


def round_record(per_client: np.ndarray, view: ClusterView, true_clusters: np.ndarray,
                 target_accuracy: float | None = None) -> dict[str, Any]:
    """Accuracy and clustering figures of one evaluation, JSON-ready.

    With a target accuracy, also the share of clients at or above it (FL+HC's second metric).
    A client a remote runtime could not evaluate, or one without test data, has NaN figures:
    the means are over the clients evaluated, and `unevaluated_clients` lists the others.
    Without a truth, `ari`, `nmi` and `per_true_cluster_accuracy` are None (null in
    metrics.jsonl).
    """
    acc = per_client[:, 1]
    found = view.assignment
    truth = truth_figures(acc, found, true_clusters)
    missing = np.flatnonzero(np.isnan(per_client).any(axis=1))
    evaluated = acc[~np.isnan(acc)]
    extra = {} if target_accuracy is None else {
        "clients_at_target": float(np.mean(evaluated >= target_accuracy - 1e-9))
        if len(evaluated) else float("nan")}
    record = {
        "mean_accuracy": evaluated_mean(acc),
        "mean_loss": evaluated_mean(per_client[:, 0]),
        "per_client_accuracy": [round(float(a), 6) for a in acc],
        "per_client_loss": [round(float(v), 6) for v in per_client[:, 0]],
        "per_cluster_accuracy": {str(int(k)): evaluated_mean(acc[found == k])
                                 for k in np.unique(found)},
        "per_true_cluster_accuracy": truth["per_true_cluster_accuracy"],
        "n_clusters": view.num_clusters,
        "ari": truth["ari"],
        "nmi": truth["nmi"],
        **extra,
    }
    if len(missing):
        record["unevaluated_clients"] = missing.tolist()
    return record
