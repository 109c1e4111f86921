"""The shared pieces the algorithms use, each against a case worked by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import vmap

from clusterfed.algorithms.aggregate import cluster_fedavg, results_fedavg
from clusterfed.algorithms.fedavg.algorithm import apply_updates
from clusterfed.algorithms.pacfl.algorithm import PACFL
from clusterfed.client import ClientResult, TaskKind, TrainSpec
from clusterfed.client.sgd import clip_by_norm, sgd_step
from clusterfed.clustering import hierarchical as hc
from clusterfed.clustering import precomputed as pc
from clusterfed.clustering.precomputed import first_appearance_labels
from clusterfed.clustering.similarity import (
    cosine_distance_matrix,
    cosine_similarity_matrix,
    euclidean_distance_matrix,
    gram_matrix,
)

pytestmark = pytest.mark.fast

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


# Gram, cosine and Euclidean matrices -------------------------------------------------------------

# A zero vector between two of length 5.
THREE = np.array([[3.0, 4.0], [0.0, 0.0], [4.0, 3.0]], dtype=np.float32)


def test_gram_matrix_by_hand():
    np.testing.assert_array_equal(gram_matrix(THREE, chunk_size=1),
                                  [[25.0, 0.0, 24.0], [0.0, 0.0, 0.0], [24.0, 0.0, 25.0]])


def test_cosine_zero_vector_rule_by_hand():
    # cos(v0, v2) = 24 / 25; the zero vector has cosine 0 with every other vector.
    similarity = cosine_similarity_matrix(THREE)
    np.testing.assert_allclose(similarity, [[1.0, 0.0, 0.96], [0.0, 0.0, 0.0], [0.96, 0.0, 1.0]],
                               rtol=1e-15)
    # With itself: 0 by default (no direction), 1 when asked (a distance's zero diagonal).
    assert similarity[1, 1] == 0.0
    assert cosine_similarity_matrix(THREE, zero_self=1.0)[1, 1] == 1.0
    distance = cosine_distance_matrix(THREE)
    np.testing.assert_allclose(distance, [[0.0, 1.0, 0.04], [1.0, 0.0, 1.0], [0.04, 1.0, 0.0]],
                               rtol=1e-12)
    assert np.array_equal(distance, distance.T) and np.all(np.diag(distance) == 0.0)


def test_euclidean_distance_by_hand():
    # |v0 - v2| = sqrt(2), |v0| = |v2| = 5; blocks of one column give the same.
    for chunk_size in (None, 1):
        distance = euclidean_distance_matrix(THREE, chunk_size=chunk_size)
        np.testing.assert_allclose(distance, [[0.0, 5.0, 2**0.5], [5.0, 0.0, 5.0],
                                              [2**0.5, 5.0, 0.0]], rtol=1e-6)
        assert np.array_equal(distance, distance.T)
    np.testing.assert_allclose(euclidean_distance_matrix(np.array([[0, 0], [3, 4]])),
                               [[0.0, 5.0], [5.0, 0.0]])


def test_centred_gram_by_hand():
    # The mean of THREE is [7/3, 7/3]; the centred rows are [2, 5]/3, [-7, -7]/3, [5, 2]/3.
    want = np.array([[29.0, -49.0, 20.0], [-49.0, 98.0, -49.0], [20.0, -49.0, 29.0]]) / 9.0
    np.testing.assert_allclose(gram_matrix(THREE, centre=True, chunk_size=1), want, rtol=1e-12)
    np.testing.assert_array_equal(THREE[1], [0.0, 0.0])   # the input is left alone


# Cluster labels and linkages -------------------------------------------------------------------


def test_first_appearance_labels_by_hand():
    # 5 appears first, then 2, then 9.
    assert first_appearance_labels(np.array([5, 5, 2, 9, 2])).tolist() == [0, 0, 1, 2, 1]
    assert first_appearance_labels(np.array([], dtype=np.int64)).tolist() == []


def test_one_list_of_linkages():
    # Every method cuts distances by the same scipy linkages; Ward only FL+HC's Euclidean vectors.
    assert set(hc.LINKAGES) == set(pc.LINKAGES) | {"ward"}
    assert PACFL().linkage in pc.LINKAGES
    with pytest.raises(ValueError, match="linkage must be one of"):
        pc.check_linkage("ward")


# The SGD step ------------------------------------------------------------------------------------


def test_sgd_step_by_hand():
    spec = TrainSpec(lr=0.5, batch_size=1, momentum=0.5, weight_decay=0.1)
    w, grad = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    # grad + 0.1 w = [3.1, 4.2]; v = 0.5 [2, 0] + [3.1, 4.2] = [4.1, 4.2]; w - 0.5 v.
    new, velocity = sgd_step(w, grad, torch.tensor([2.0, 0.0]), spec)
    torch.testing.assert_close(velocity, torch.tensor([4.1, 4.2]))
    torch.testing.assert_close(new, torch.tensor([-1.05, -0.1]))
    torch.testing.assert_close(w, torch.tensor([1.0, 2.0]))   # nothing changed in place
    # The first step starts the buffer at the gradient; a proximal pull and a correction.
    new, velocity = sgd_step(w, grad, None, TrainSpec(lr=1.0, batch_size=1, momentum=0.9),
                             prox_mu=2.0, anchor=torch.zeros(2), correction=torch.ones(2))
    torch.testing.assert_close(velocity, torch.tensor([5.0, 8.0]))   # [3, 4] + 2 [1, 2]
    torch.testing.assert_close(new, torch.tensor([-5.0, -7.0]))       # w - (v + 1)


@pytest.mark.parametrize("spec, prox, correct", [
    (TrainSpec(lr=0.1, batch_size=1), 0.0, False),
    (TrainSpec(lr=0.1, batch_size=1, momentum=0.9, weight_decay=0.01, clip_grad_norm=1.0),
     0.3, True),
    (TrainSpec(lr=0.05, batch_size=1, momentum=0.5), 0.0, True),
])
def test_sgd_step_in_place_is_the_same_bits(spec, prox, correct):
    # The sequential loop's in-place step against the pure one, over steps that carry the
    # momentum buffer: equal bit for bit (same kernels on the same values).
    gen = torch.Generator().manual_seed(1)
    w0, anchor, correction = (torch.randn(1000, generator=gen) for _ in range(3))
    grads = [torch.randn(1000, generator=gen) * 3 for _ in range(4)]
    options = {"prox_mu": prox, "anchor": anchor, "correction": correction if correct else None}
    w, v = w0.clone(), None
    w_, v_ = w0.clone(), None
    for g in grads:
        w, v = sgd_step(w, g.clone(), v, spec, **options)
        new, v_ = sgd_step(w_, g.clone(), v_, spec, **options, in_place=True)
        assert new is w_   # written into w
        assert torch.equal(w, w_)
        assert (v is None) == (v_ is None) and (v is None or torch.equal(v, v_))


def test_clip_by_norm_by_hand():
    clipped = clip_by_norm(torch.tensor([[3.0, 4.0], [0.3, 0.4]]), 1.0)
    # Norm 5 is scaled to about 1; norm 0.5 is left alone.
    torch.testing.assert_close(clipped, torch.tensor([[0.6, 0.8], [0.3, 0.4]]))


def test_sgd_step_under_vmap_is_row_by_row():
    spec = TrainSpec(lr=0.1, batch_size=1, momentum=0.5, weight_decay=0.01, clip_grad_norm=1.0)
    gen = torch.Generator().manual_seed(0)
    w, grad, velocity = (torch.randn(4, 30, generator=gen) for _ in range(3))
    mapped = vmap(lambda a, b, c: sgd_step(a, b, c, spec))(w, grad, velocity)
    stacked = sgd_step(w, grad, velocity, spec)
    for g in range(4):
        row = sgd_step(w[g], grad[g], velocity[g], spec)
        for got in (mapped, stacked):
            torch.testing.assert_close(got[0][g], row[0], rtol=0, atol=1e-7)
            torch.testing.assert_close(got[1][g], row[1], rtol=0, atol=1e-7)
