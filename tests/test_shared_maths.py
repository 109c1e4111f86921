"""The shared pieces the algorithms use, each against a case worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed.algorithms.aggregate import cluster_fedavg, results_fedavg
from clusterfed.algorithms.fedavg import apply_updates
from clusterfed.client import ClientResult, TaskKind

# Per-cluster FedAvg ----------------------------------------------------------------------------


def test_cluster_fedavg_by_hand():
    models = np.array([[0.0, 0.0], [10.0, 10.0], [5.0, 5.0]], dtype=np.float32)
    updates = np.array([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0]], dtype=np.float32)
    got = cluster_fedavg(models, updates, np.array([0, 0, 1]), np.array([1.0, 3.0, 2.0]))
    # Cluster 0: (1 [1, 2] + 3 [3, 4]) / 4 = [2.5, 3.5]; cluster 1: + [10, 0]; cluster 2 unused.
    np.testing.assert_array_equal(got, [[2.5, 3.5], [20.0, 10.0], [5.0, 5.0]])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(models[0], [0.0, 0.0])   # the input is left alone


def test_one_cluster_is_fedavg_bit_for_bit():
    rng = np.random.default_rng(0)
    model = rng.normal(size=50).astype(np.float32)
    results = [ClientResult(c, TaskKind.TRAIN, int(rng.integers(5, 50)),
                            rng.normal(size=50).astype(np.float32)) for c in range(7)]
    want = apply_updates(model, results, "samples")
    got = results_fedavg(model[None], results, [0] * 7, "samples")
    np.testing.assert_array_equal(got[0], want)


def test_cluster_fedavg_needs_one_cluster_per_update():
    with pytest.raises(ValueError, match="one cluster"):
        cluster_fedavg(np.zeros((2, 2)), np.zeros((3, 2)), np.array([0, 1]), np.ones(3))
