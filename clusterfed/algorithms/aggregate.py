"""Aggregation mathematics: small pure functions over stacked flat vectors."""

from __future__ import annotations

import numpy as np


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
