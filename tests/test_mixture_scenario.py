"""The `mixture` scenario (every client a mixture of rotated sources, FedSoft's setting), its
transform, and the score of estimated weights against the true shares."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import tiny_config

from clusterfed.clustering.metrics import one_hot, shares_error
from clusterfed.config import merge
from clusterfed.data import Dataset, build_federation, load_dataset
from clusterfed.data.transforms import Mixed, Rotate, mixture_counts
from clusterfed.errors import ConfigError
from clusterfed.sim.simulation import run_config


def corner_dataset(n_train: int = 2000, n_test: int = 800) -> Dataset:
    """One bright top-left pixel: rotated 90 degrees counter-clockwise it is bottom-left."""
    def images(n: int) -> np.ndarray:
        x = np.zeros((n, 1, 4, 4), dtype=np.uint8)
        x[:, 0, 0, 0] = 255
        return x

    return Dataset("corner", images(n_train), np.arange(n_train) % 10,
                   images(n_test), np.arange(n_test) % 10, 10)


def unrotated(x: np.ndarray) -> int:
    return int((x[:, 0, 0, 0] == 1.0).sum())


def test_mixture_counts_follow_the_authors_rounding() -> None:
    # int(0.3 * 151) = 45, the last source the rest
    np.testing.assert_array_equal(mixture_counts((0.3, 0.7), 151), [45, 106])
    np.testing.assert_array_equal(mixture_counts((0.25, 0.25, 0.5), 10), [2, 2, 6])
    np.testing.assert_array_equal(mixture_counts((0.999, 0.001), 10), [9, 1])
    np.testing.assert_array_equal(mixture_counts((1.0,), 7), [7])


def test_mixed_transforms_consecutive_slices_and_keeps_labels() -> None:
    x = np.zeros((10, 1, 4, 4), dtype=np.uint8)
    x[:, 0, 0, 0] = 255
    y = np.arange(10)
    mixed = Mixed((0.3, 0.7), (Rotate(0.0), Rotate(90.0)))
    out = mixed.apply_x(x)
    assert (out[:3, 0, 0, 0] == 255).all() and (out[:3, 0, 3, 0] == 0).all()
    assert (out[3:, 0, 3, 0] == 255).all() and (out[3:, 0, 0, 0] == 0).all()
    np.testing.assert_array_equal(mixed.apply_y(y), y)


def test_linear_shares_are_the_authors_and_the_truth_is_the_dominant_source() -> None:
    fed = build_federation(corner_dataset(), {"kind": "mixture", "clients": 10, "clusters": 2,
                                              "angles": [0, 90], "samples_per_client": 150,
                                              "test_samples_per_client": 60}, seed=1)
    first = (np.arange(10) + 0.5) / 10
    np.testing.assert_allclose(np.asarray(fed.info["shares"])[:, 0], first)
    np.testing.assert_array_equal(fed.true_clusters, [1] * 5 + [0] * 5)
    for i, c in enumerate(fed.clients):
        assert unrotated(c.train_x) == int(first[i] * 150)
        assert unrotated(c.test_x) == int(first[i] * 60)
        # every other image is the rotated one: its pixel bottom-left
        assert (c.train_x[:, 0, 3, 0] == 1.0).sum() == 150 - unrotated(c.train_x)
    assert fed.info["share_rule"] == "linear" and fed.info["angles"] == [0.0, 90.0]


def test_block_shares_give_each_half_its_vector() -> None:
    fed = build_federation(corner_dataset(), {"kind": "mixture", "clients": 8, "clusters": 2,
                                              "shares": [[0.3, 0.7], [0.7, 0.3]],
                                              "samples_per_client": 100}, seed=0)
    np.testing.assert_array_equal(fed.true_clusters, [1] * 4 + [0] * 4)
    assert [unrotated(c.train_x) for c in fed.clients] == [30] * 4 + [70] * 4
    # default angles: 360 s / S
    assert fed.info["angles"] == [0.0, 180.0] and fed.info["share_rule"] == "blocks"


def test_dirichlet_shares_are_seeded_and_leave_the_data_draws_alone() -> None:
    spec = {"kind": "mixture", "clients": 12, "clusters": 3, "shares": "dirichlet",
            "alpha": 0.5, "samples_per_client": 100}
    a = build_federation(corner_dataset(), spec, seed=4)
    b = build_federation(corner_dataset(), spec, seed=4)
    shares = np.asarray(a.info["shares"])
    np.testing.assert_array_equal(shares, b.info["shares"])
    np.testing.assert_allclose(shares.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(a.true_clusters, np.argmax(shares, axis=1))
    assert len({tuple(row) for row in np.round(shares, 3)}) == 12   # drawn per client
    flat = build_federation(corner_dataset(), {**spec, "alpha": 1e4}, seed=4)
    np.testing.assert_allclose(flat.info["shares"], 1 / 3, atol=0.03)
    # the same samples whatever the rule: labels are untouched by the transforms
    for x, y in zip(a.clients, flat.clients, strict=True):
        np.testing.assert_array_equal(x.train_y, y.train_y)


@pytest.mark.parametrize(("spec", "words"), [
    ({"clusters": 3}, "linear mixes 2 sources"),
    ({"angles": [0, 90, 180]}, "3 angles for 2 sources"),
    ({"shares": [[0.5, 0.6]]}, "summing to 1"),
    ({"shares": [[0.5, 0.25, 0.25]]}, "vectors of 2 shares"),
    ({"shares": "uniform"}, "unknown scenario.shares"),
    ({"shares": "dirichlet", "alpha": 0}, "alpha"),
    ({"shares": [[1.0, 0.0]] * 5}, "5 blocks for 4 clients"),
    ({"drift": {"round": 2, "clients": [0]}}, "no drift"),
])
def test_bad_mixtures_are_refused_clearly(spec: dict, words: str) -> None:
    base = {"kind": "mixture", "clients": 4, "clusters": 2, "samples_per_client": 20}
    with pytest.raises(ConfigError, match=words):
        build_federation(corner_dataset(), {**base, **spec}, seed=0)


def test_mixture_needs_images() -> None:
    text = Dataset("tokens", np.zeros((40, 5), np.int64), np.zeros(40, np.int64),
                   np.zeros((10, 5), np.int64), np.zeros(10, np.int64), 2)
    with pytest.raises(ConfigError, match="transforms images"):
        build_federation(text, {"kind": "mixture", "clients": 2, "clusters": 2}, seed=0)


def test_shares_error_by_hand() -> None:
    true = np.array([[0.25, 0.75], [1.0, 0.0]])
    # hard and right: client 0 loses its minority 0.25, client 1 nothing
    assert shares_error(true, one_hot(np.array([1, 0]), 2)) == pytest.approx(0.125)
    # the models' order does not matter
    assert shares_error(true, one_hot(np.array([0, 1]), 2)) == pytest.approx(0.125)
    assert shares_error(true, true[:, ::-1]) == pytest.approx(0.0)
    # unnormalised rows are normalised (FedSoft's smoothed u)
    assert shares_error(true, 2 * true) == pytest.approx(0.0)
    # a third model: its mass is an error; client 0: |.25-0|+|.75-.5|+|0-.5| = 1 -> 0.5
    three = np.array([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    assert shares_error(true, three) == pytest.approx(0.25)
    # one model for two sources, best matched to source 0: each client loses its share of
    # source 1 (0.75 and 0); matched to source 1 it would be 0.25 and 1
    assert shares_error(true, np.ones((2, 1))) == pytest.approx((0.75 + 0.0) / 2)
    with pytest.raises(ValueError, match="same clients"):
        shares_error(true, np.ones((3, 2)))


def test_a_run_on_a_mixture_scores_the_weights_it_estimates() -> None:
    mixture = {"kind": "mixture", "clients": 4, "clusters": 2, "angles": [0, 90],
               "samples_per_client": 60, "test_samples_per_client": 20}
    train = {"rounds": 1, "participation": 1.0}
    fedavg = run_config(tiny_config("fedavg", scenario=mixture, train=train))
    # one model: matched to either source the error is the mean share of the other, 0.5
    assert fedavg["clustering"]["shares_error"] == pytest.approx(0.5)
    fedsoft = run_config(merge(tiny_config("fedsoft", scenario=mixture, train=train),
                               {"algorithm": {"k": 2, "tau": 1}}))
    error = fedsoft["clustering"]["shares_error"]
    # scored on its importance weights u, not on the one centre each client is served
    shares = np.asarray(build_federation(load_dataset("digits"), mixture, seed=3).info["shares"])
    served = one_hot(np.asarray(fedsoft["clustering"]["assignment"]), 2)
    assert 0.0 <= error < 0.5 and error != pytest.approx(shares_error(shares, served))
    digits = run_config(tiny_config("fedavg", train=train))
    assert "shares_error" not in digits["clustering"]   # no mixture, no score
