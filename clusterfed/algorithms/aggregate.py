"""Aggregation mathematics: small pure functions over stacked flat vectors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from clusterfed.tasks import ClientResult

# Columns a block: the float64 copy of one block (n x BLOCK) stays small however many clients
# there are; stacking every update, then copying it to float64, held 3x the updates at once.
BLOCK = 1 << 14

Vectors = np.ndarray | Sequence[np.ndarray]


def weighted_mean(vectors: Vectors, weights: np.ndarray) -> np.ndarray:
    """sum_i w_i v_i / sum_i w_i over the rows of `vectors` (an n x d array, or n vectors of
    length d, never stacked), in float64 then float32, a block of columns at a time."""
    weights = np.asarray(weights, dtype=np.float64)
    if len(vectors) != len(weights) or any(np.ndim(v) != 1 for v in vectors):
        raise ValueError("weighted_mean needs n vectors (n x d) and n weights")
    if len(weights) == 0 or weights.sum() <= 0:
        raise ValueError("weighted_mean needs at least one positive weight")
    d = len(vectors[0])
    if any(len(v) != d for v in vectors):
        raise ValueError("weighted_mean needs vectors of one length")
    weights = weights / weights.sum()
    out = np.empty(d, dtype=np.float32)
    for start in range(0, d, BLOCK):
        block = np.stack([v[start:start + BLOCK] for v in vectors]).astype(np.float64)
        out[start:start + BLOCK] = weights @ block
    return out


# How a method weighs its clients' updates in an average: the option `weighting` of every
# method that averages, declared here once.
Weighting = Literal["samples", "uniform"]


def aggregation_weights(num_samples: np.ndarray, weighting: Weighting) -> np.ndarray:
    """'samples': proportional to local dataset size (FedAvg); 'uniform': equal weights."""
    if weighting == "samples":
        return np.asarray(num_samples, dtype=np.float64)
    if weighting == "uniform":
        return np.ones(len(num_samples), dtype=np.float64)
    raise ValueError(f"weighting must be one of {', '.join(get_args(Weighting))}, "
                     f"got {weighting!r}")


def cluster_fedavg(models: np.ndarray, updates: Vectors, clusters: np.ndarray,
                   weights: np.ndarray) -> np.ndarray:
    """Per-cluster FedAvg: row c of `models` (k x d) plus the weighted mean of the updates
    (n x d, or n vectors) whose `clusters` entry is c; a cluster without updates keeps its model.

    Each mean is `weighted_mean` over the cluster's rows in their given order, added in float32,
    so one cluster gives FedAvg's model bit for bit.
    """
    clusters = np.asarray(clusters)
    weights = np.asarray(weights, dtype=np.float64)
    if len(clusters) != len(updates) or len(weights) != len(updates):
        raise ValueError("cluster_fedavg needs one cluster and one weight per update")
    out = np.array(models, dtype=np.float32)
    for c in np.unique(clusters):
        members = np.flatnonzero(clusters == c)
        out[c] += weighted_mean([updates[i] for i in members], weights[members])
    return out


def results_fedavg(models: np.ndarray, results: Sequence[ClientResult], clusters: Sequence[int],
                   weighting: Weighting) -> np.ndarray:
    """`cluster_fedavg` of the results' updates, weighted by `weighting` of their sample counts."""
    if not results:
        return np.array(models, dtype=np.float32)
    weights = aggregation_weights(np.array([r.num_samples for r in results]), weighting)
    return cluster_fedavg(models, [r.update for r in results],
                          np.asarray(clusters, dtype=np.int64), weights)
