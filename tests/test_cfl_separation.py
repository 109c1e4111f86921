"""CFL Fig. 3's synthetic study (clusterfed/algorithms/cfl/separation.py)."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed.algorithms.cfl import separation as sep

pytestmark = pytest.mark.fast


def test_synthetic_gradients_are_stationary_with_noise_at_gamma():
    rng = np.random.default_rng(0)
    grads, labels = sep.synthetic_gradients(4, 0.7, rng, dim=50)
    assert grads.shape == (12, 50) and np.bincount(labels).tolist() == [3, 3, 3, 3]
    # Each distribution's clients share v_l; the noise about it is 0.7 ||v_l|| long, and the
    # v_l sum to zero.
    v = np.stack([grads[labels == c].mean(0) for c in range(4)])   # noisy estimates of v_l
    rng = np.random.default_rng(0)
    true_v = rng.standard_normal((4, 50))
    true_v -= true_v.mean(0)
    np.testing.assert_allclose(true_v.sum(0), 0, atol=1e-12)
    noise = grads - true_v[labels]
    np.testing.assert_allclose(np.linalg.norm(noise, axis=1),
                               0.7 * np.linalg.norm(true_v[labels], axis=1))
    assert np.abs(v - true_v).max() < np.abs(true_v).max()


def test_a_positive_gap_always_means_a_correct_split_and_small_noise_gives_it():
    # Corollary 1: g > 0 => Algorithm 1's bipartition is correct; not the converse.
    rng = np.random.default_rng(1)
    both = np.array([sep.trial(5, 1.5, rng) for _ in range(60)])
    assert both[both[:, 0], 1].all()
    assert (~both[:, 0] & both[:, 1]).any()          # correct with g <= 0 happens
    # Inside Theorem 1's guarantee, gamma < sin(pi / (4 (k - 1))), g > 0 on every draw.
    k = 10
    gamma = 0.9 * np.sin(np.pi / (4 * (k - 1)))
    assert all(sep.trial(k, gamma, rng)[0] for _ in range(30))
    assert sep.splits_no_distribution(np.array([0, 0, 1, 1]), np.array([0, 1]))
    assert not sep.splits_no_distribution(np.array([0, 0, 1, 1]), np.array([0, 2]))


def test_figure3_table_has_the_papers_shape():
    table = sep.figure3(ks=(2, 10), gammas=(0.5, 3.0), trials=30)
    assert table["gap_positive"]["10"]["0.5"] == 1.0
    assert table["gap_positive"]["10"]["3.0"] == 0.0
    assert table["correct"]["2"]["3.0"] > table["correct"]["10"]["3.0"]
    assert "| 10 | 1.000 | 0.000 |" in sep.markdown(sep.over_seeds([table["gap_positive"]]))


def test_seeds_give_each_cell_its_mean_and_sample_std():
    a = {"2": {"1.0": 0.5, "3.0": 0.0}}
    b = {"2": {"1.0": 0.7, "3.0": 0.0}}
    table = sep.over_seeds([a, b])
    assert table["2"]["1.0"] == pytest.approx((0.6, 0.1414213), abs=1e-6)  # sqrt(0.02)
    assert table["2"]["3.0"] == (0.0, 0.0)
    assert "| 2 | 0.600 ± 0.141 | 0.000 ± 0.000 |" in sep.markdown(table)


def test_beyond_gamma_one_the_bipartition_outlives_the_gap():
    """The recorded claim (docs/reproductions/cfl.md, Fig. 3): at k = 10, gamma = 1.5 the gap
    is positive on about 40 % of draws, the bipartition correct on about 95 %."""
    table = sep.figure3(ks=(10,), gammas=(1.5,), trials=60, seed=5)
    assert table["gap_positive"]["10"]["1.5"] < 0.65
    assert table["correct"]["10"]["1.5"] > 0.8
