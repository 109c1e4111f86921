"""FedEM's synthetic mixture dataset (clusterfed/data/synthetic.py): generated, not read."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed.data.datasets import DATASETS
from clusterfed.data.synthetic import mixture_labels, sample_sizes
from clusterfed.errors import ConfigError
from tests.helpers import tiny_config

pytestmark = pytest.mark.fast


def load(**options):
    return DATASETS.get("fedem_synthetic")(None, **options)


def test_labels_are_the_sign_of_each_samples_own_component():
    theta = np.array([[1.0, 0.0], [0.0, -1.0]])
    x = np.array([[0.5, 0.5], [0.5, 0.5], [-0.2, -0.9], [-0.2, -0.9]])
    z = np.array([0, 1, 0, 1])
    # logits: 0.5, -0.5, -0.2, 0.9 (noise 0): sigmoid then round is 1 exactly where > 0.
    assert mixture_labels(x, z, theta, np.zeros(4)).tolist() == [1, 0, 0, 1]


def test_sizes_follow_the_authors_bounds():
    sizes = sample_sizes(np.random.default_rng(0), 2000)
    assert sizes.min() >= 50 and sizes.max() == 1000
    # LogNormal(4, 2) has median e^4 ~ 55: about half the clients hold <= 105 samples.
    assert 0.4 < np.mean(sizes <= 105) < 0.6


def test_each_client_is_a_mixture_of_its_components():
    data = load(clients=8, components=3, dimension=20, noise_level=0.0, alpha=0.4, n_test=3000,
                seed=1)
    pi, theta = np.asarray(data.meta["pi"]), np.asarray(data.meta["theta"])
    assert data.n_classes == 2 and data.train_x.dtype == np.float32
    assert np.all(np.abs(data.train_x) <= 1.0)
    assert np.array_equal(np.unique(data.test_groups), np.arange(8))
    for t in range(8):
        x = data.test_x[data.test_groups == t]
        y = data.test_y[data.test_groups == t]
        # With noise 0 a sample's label is component z's sign, z ~ pi_t independent of x, so
        # P(component m's sign = y) = sum_m' pi_m' P(sign m = sign m'): brute force over x.
        signs = x @ theta.T > 0
        same = (signs[:, :, None] == signs[:, None, :]).mean(axis=0)
        agree = (signs == y[:, None]).mean(axis=0)
        assert np.allclose(agree, same @ pi[t], atol=0.04), (t, agree, same @ pi[t])
        assert data.meta["group_clusters"][t] == int(np.argmax(pi[t]))


def test_the_data_seed_fixes_the_data():
    a, b = load(clients=3, dimension=5, n_test=10), load(clients=3, dimension=5, n_test=10)
    assert np.array_equal(a.train_x, b.train_x) and np.array_equal(a.train_y, b.train_y)
    assert not np.array_equal(a.train_x, load(clients=3, dimension=5, n_test=10,
                                              seed=2).train_x)


def test_writers_makes_one_client_per_generated_client():
    from clusterfed.sim.simulation import build_federation_for

    config = tiny_config(data={"dataset": "fedem_synthetic", "clients": 6, "dimension": 10,
                               "n_test": 20},
                         scenario={"kind": "writers", "clients": 6, "select": "first"},
                         model={"name": "mlp", "hidden": []})
    federation = build_federation_for(config, None)
    data = load(clients=6, dimension=10, n_test=20)
    assert len(federation.clients) == 6
    sizes = sorted(len(c.train_y) for c in federation.clients)
    assert sizes == sorted(np.bincount(data.train_groups).tolist())
    assert all(len(c.test_y) == 20 for c in federation.clients)


@pytest.mark.parametrize("options", [{"clients": 0}, {"alpha": 0.0}, {"dimension": 2.5}])
def test_bad_options_are_one_clear_error(options):
    with pytest.raises(ConfigError, match="data\\."):
        load(**options)
