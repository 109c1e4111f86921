"""A client without test data is not scored: its accuracy is NaN, not 0, and the means are
over the clients that hold test data (quantity skew leaves some clients none)."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed.algorithms import ClusterView
from clusterfed.client import ClientResult, ClientTask, TaskKind
from clusterfed.sim.protocols import PROTOCOLS, EvalContext, run_protocol

pytestmark = pytest.mark.fast


def answer(task: ClientTask, sizes: dict[int, int], accuracy: dict[int, float]) -> ClientResult:
    """What an executor answers: figures of 0 over no samples for an empty test set."""
    n = sizes[task.client]
    acc = accuracy[task.client] if n else 0.0
    return ClientResult(task.client, TaskKind.EVALUATE, n, losses=np.array([1.0 if n else 0.0]),
                        accuracies=np.array([acc]), meta=task.meta)


def test_a_client_without_test_data_is_left_out_of_the_means():
    sizes = {0: 10, 1: 0, 2: 30}
    accuracy = {0: 0.9, 1: 0.0, 2: 0.6}
    view = ClusterView(np.zeros((1, 3), np.float32), np.zeros(3, np.int64))
    ev = EvalContext(view=view, true_clusters=np.zeros(3, np.int64),
                     test_sizes=np.array([10, 0, 30]))
    record = run_protocol(PROTOCOLS["cluster"], ev,
                          lambda tasks: [(t, answer(t, sizes, accuracy)) for t in tasks])
    # by hand: (0.9 + 0.6) / 2 over the two clients with test data, not (0.9 + 0 + 0.6) / 3
    assert record["mean_accuracy"] == np.float64(0.75)
    assert np.isnan(record["per_client_accuracy"][1])
