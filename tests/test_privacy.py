"""The privacy transform: orthonormal, invertible, and invisible in the results."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import comparable, tiny_config

from clusterfed.client.privacy import ParameterTransform
from clusterfed.errors import ConfigError
from clusterfed.sim.simulation import Simulation


@pytest.mark.parametrize("kind", ["permutation", "signed_permutation"])
def test_transform_is_orthonormal_and_invertible(kind):
    t = ParameterTransform.from_seed(kind, 5, 50)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    np.testing.assert_array_equal(t.inverse(t.forward(a)), a)
    assert not np.array_equal(t.forward(a), a)
    assert np.dot(t.forward(a), t.forward(b)) == pytest.approx(np.dot(a, b))   # Eq. 45
    stacked = np.stack([a, b])
    np.testing.assert_array_equal(t.forward(stacked)[1], t.forward(b))
    # Eq. 46: averaging commutes with P, coordinate by coordinate, exactly.
    np.testing.assert_array_equal(t.forward(stacked).mean(0), t.forward(stacked.mean(0)))
    with pytest.raises(ConfigError, match="unknown run.privacy"):
        ParameterTransform.from_seed("rotation", 5, 50)


@pytest.mark.parametrize("name", ["fedavg", "local"])
def test_runs_are_identical_with_and_without_privacy(name):
    plain = Simulation(tiny_config(name))
    private = Simulation(tiny_config(name, run={"privacy": "permutation", "privacy_seed": 11}))
    assert comparable(plain.run()) == comparable(private.run())
    # The server only ever held P-space models.
    transform = private.executor.transform
    view_plain = plain.algorithm.clusters(plain.state).models
    view_private = private.algorithm.clusters(private.state).models
    assert not np.array_equal(view_plain, view_private)
    np.testing.assert_array_equal(transform.inverse(view_private), view_plain)
