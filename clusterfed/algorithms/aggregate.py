"""Aggregation mathematics: small pure functions over stacked flat vectors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clusterfed.client.tasks import ClientResult


def weighted_mean(vectors: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_i w_i v_i / sum_i w_i over the rows of `vectors` (n x d), in float64 then float32."""
    weights = np.asarray(weights, dtype=np.float64)
    if vectors.ndim != 2 or len(vectors) != len(weights):
        raise ValueError("weighted_mean needs n vectors (n x d) and n weights")
    if len(weights) == 0 or weights.sum() <= 0:
        raise ValueError("weighted_mean needs at least one positive weight")
    return ((weights / weights.sum()) @ vectors.astype(np.float64)).astype(np.float32)


def aggregation_weights(num_samples: np.ndarray, weighting: str) -> np.ndarray:
    """'samples': proportional to local dataset size (FedAvg); 'uniform': equal weights."""
    if weighting == "samples":
        return np.asarray(num_samples, dtype=np.float64)
    if weighting == "uniform":
        return np.ones(len(num_samples), dtype=np.float64)
    raise ValueError(f"weighting must be 'samples' or 'uniform', got {weighting!r}")


def cluster_fedavg(models: np.ndarray, updates: np.ndarray, clusters: np.ndarray,
                   weights: np.ndarray) -> np.ndarray:
    """Per-cluster FedAvg: row c of `models` (k x d) plus the weighted mean of the updates
    (n x d) whose `clusters` entry is c; a cluster without updates keeps its model.

    Each mean is `weighted_mean` over the cluster's rows in their given order, added in float32,
    so one cluster gives FedAvg's model bit for bit.
    """
    clusters = np.asarray(clusters)
    weights = np.asarray(weights, dtype=np.float64)
    if len(clusters) != len(updates) or len(weights) != len(updates):
        raise ValueError("cluster_fedavg needs one cluster and one weight per update")
    out = np.array(models, dtype=np.float32)
    for c in np.unique(clusters):
        members = clusters == c
        out[c] += weighted_mean(updates[members], weights[members])
    return out


def results_fedavg(models: np.ndarray, results: Sequence[ClientResult], clusters: Sequence[int],
                   weighting: str) -> np.ndarray:
    """`cluster_fedavg` of the results' updates, weighted by `weighting` of their sample counts."""
    if not results:
        return np.array(models, dtype=np.float32)
    weights = aggregation_weights(np.array([r.num_samples for r in results]), weighting)
    return cluster_fedavg(models, np.stack([r.update for r in results]),
                          np.asarray(clusters, dtype=np.int64), weights)
