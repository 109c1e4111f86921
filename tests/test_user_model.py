"""Any user nn.Module works in place of the registered models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import tiny_config
from torch import nn

from clusterfed.errors import ConfigError
from clusterfed.sim.simulation import Simulation


def test_user_module_instance_starts_from_its_own_weights():
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    with torch.no_grad():
        module[1].weight.fill_(0.01)
    start = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).numpy()
    sim = Simulation(tiny_config("fedavg"), module=module)
    np.testing.assert_array_equal(sim.setup.initial_params, start)
    summary = sim.run()
    assert np.isfinite(summary["final"]["mean_accuracy"])
    assert sim.state.model.shape == (64 * 10 + 10,)


def test_user_factory_by_import_path_with_options():
    sim = Simulation(tiny_config("fedavg", model={"name": "user_models:tiny_mlp", "hidden": 8}))
    assert sim.model.size == 64 * 8 + 8 + 8 * 10 + 10
    sim.run()


@pytest.mark.parametrize("name, message", [
    ("no_such_module:f", "cannot import no_such_module"),
    ("user_models:missing", "has no callable 'missing'"),
])
def test_bad_import_path(name, message):
    with pytest.raises(ConfigError, match=message):
        Simulation(tiny_config("fedavg", model={"name": name}))
