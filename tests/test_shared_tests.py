"""Test samples several clients hold (`test: by_labels`) are scored once per model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import uneven_digits

from clusterfed.client import runtime
from clusterfed.client.shared_tests import evaluate_shared, shared_tests
from clusterfed.client.work import evaluate
from clusterfed.data import build_federation, load_dataset
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.executor import SequentialExecutor

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def by_labels():
    return build_federation(load_dataset("digits"),
                            {"kind": "label_skew", "clients": 8, "label_fraction": 0.3,
                             "test": "by_labels"}, seed=0)


class Counting:
    """A model that counts the samples it is asked to score."""

    def __init__(self, model: FlatModel) -> None:
        self.model, self.rows = model, 0

    def __call__(self, params, x):
        self.rows += len(x)
        return self.model(params, x)

    def __getattr__(self, name):
        return getattr(self.model, name)


def data(fed):
    return [(torch.from_numpy(c.test_x), torch.from_numpy(c.test_y)) for c in fed.clients]


def test_a_model_goes_once_through_each_shared_sample_and_each_client_gets_its_own_figures(
        by_labels):
    torch.manual_seed(0)
    model = FlatModel(build_model("digits_cnn", by_labels.input_shape, 10))
    w = model.initial_vector() + 0.05 * torch.randn(model.size)   # not a constant guess
    tests = data(by_labels)
    distinct = len(np.unique(np.concatenate([c.test_x.reshape(len(c.test_x), -1)
                                             for c in by_labels.clients]), axis=0))
    total = sum(len(y) for _, y in tests)
    assert distinct * 2 < total                       # 3 labels of 10 a client: they overlap
    pool = shared_tests(tests)
    assert pool is not None and pool.size == distinct
    counting = Counting(model)
    clients = [6, 1, 0, 3, 7, 2, 5, 4]   # 24 label slots over 10 labels
    got = evaluate_shared(counting, w, pool, clients)
    expected = np.array([evaluate(model, w, *tests[c]) for c in clients])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9)
    assert len(set(np.round(expected[:, 1], 6))) > 1  # the clients' figures differ
    assert counting.rows == len(np.unique(np.concatenate([pool.rows[c] for c in clients])))
    assert counting.rows < sum(len(tests[c][1]) for c in clients)
    few = [6, 1, 3]                                   # a part of the pool, wherever it lies
    got = evaluate_shared(model, w, pool, few, max_share=1.0)
    np.testing.assert_allclose(got, expected[[0, 1, 3]], rtol=1e-6, atol=1e-9)


def test_the_runtime_scores_by_labels_clients_through_the_pool(by_labels, monkeypatch):
    seq = SequentialExecutor(FlatModel(build_model("digits_cnn", by_labels.input_shape, 10)),
                             by_labels, 0)
    w = seq.model.initial_vector().numpy()
    clients = list(range(by_labels.num_clients))
    pooled = seq.evaluate(w, clients)
    monkeypatch.setattr(runtime, "evaluate_clients", lambda *a, **k: pytest.fail("not pooled"))
    np.testing.assert_allclose(seq.evaluate(w, clients), pooled)
    monkeypatch.undo()
    alone = np.array([seq.evaluate(w, [c])[0] for c in clients])   # one client: no pool
    np.testing.assert_allclose(pooled, alone, rtol=1e-6, atol=1e-9)


def test_disjoint_test_sets_and_whole_sets_held_alike_make_no_pool():
    assert shared_tests(data(uneven_digits())) is None   # each client its own test share
    fed = build_federation(load_dataset("digits"),
                           {"kind": "label_permutation", "clients": 6, "clusters": 2,
                            "test": "all", "samples_per_client": 40}, seed=0)
    tests = data(fed)
    keys = [runtime.test_key(x, y) for x, y in tests]
    pool = shared_tests(tests)                     # six copies of two sets: the same
    n = len(tests[0][1])                           # images, two labellings (a few alike)
    assert pool is not None and n < pool.size <= 2 * n
    assert shared_tests(tests, keys) is None       # ... are two sets, scored once each already


def test_samples_of_several_shapes_make_no_pool():
    x = torch.zeros(4, 3, dtype=torch.long)
    tests = [(x, x), (x[:, :2], x[:, :2])]         # sequences of two lengths
    assert shared_tests(tests) is None


def test_clients_sharing_few_samples_are_scored_client_by_client(by_labels):
    model = FlatModel(build_model("digits_cnn", by_labels.input_shape, 10))
    tests = data(by_labels)
    pool = shared_tests(tests)
    labels = [set(np.unique(c.test_y)) for c in by_labels.clients]
    pair = next((a, b) for a in range(len(labels)) for b in range(a)
                if not labels[a] & labels[b])      # two clients without a common label
    assert evaluate_shared(model, model.initial_vector(), pool, list(pair)) is None
