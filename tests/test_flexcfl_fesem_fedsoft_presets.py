"""The FlexCFL, FeSEM and FedSoft paper presets (docs/reproductions/flexcfl.md, fesem.md,
fedsoft.md): both scales exist, resolve, and every algorithm they compare builds."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed import config as cfg
from clusterfed.algorithms import build_algorithm
from clusterfed.experiments.compare import algorithm_sections
from clusterfed.experiments.reproduce import check_reproduce, runs_of

NAMES = ("flexcfl-mnist", "fesem-mnist", "fedsoft-rotmnist", "fedsoft-mixture-mnist")
PRESETS = [n for base in NAMES for n in (base, f"{base}-small")]


def test_the_paper_presets_exist_at_both_scales():
    assert set(PRESETS) <= set(cfg.preset_names())


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_resolves_and_its_algorithms_build(name):
    config = cfg.resolve(name)
    build_algorithm(config["algorithm"])
    for section in algorithm_sections(config, None):
        section.pop("label", None)
        build_algorithm(section)
    check_reproduce(config["reproduce"])
    # reproduce runs each listed algorithm merged into the preset's own section
    for _, section in runs_of(config):
        build_algorithm(cfg.merge(config, {"algorithm": section})["algorithm"])
    assert cfg.preset_paths()[name].read_text().startswith("#")


@pytest.mark.parametrize("base", NAMES)
def test_the_small_twin_differs_only_in_scale(base):
    """Same data, model, learning rate and method; fewer clients, epochs or rounds."""
    full, small = cfg.resolve(base), cfg.resolve(f"{base}-small")
    assert full["data"] == small["data"] and full["model"] == small["model"]
    assert full["train"]["lr"] == small["train"]["lr"]
    assert full["algorithm"]["name"] == small["algorithm"]["name"]
    assert small["scenario"]["clients"] <= full["scenario"]["clients"]
    assert small["train"]["rounds"] < full["train"]["rounds"]


@pytest.mark.parametrize("name", ["flexcfl-mnist", "flexcfl-mnist-small"])
def test_flexcfl_presets_use_fedprox_mnist_label_rule(name):
    """FedProx's MNIST (data/mnist/generate_niid.py): user u holds digits u and u + 1 mod 10,
    so only the 10 consecutive pairs occur (not 2 random digits: 45 pairs). Built on sklearn's
    digits with the preset's scenario at 20 clients."""
    from clusterfed.data import build_federation, load_dataset

    scenario = {**cfg.resolve(name)["scenario"], "clients": 20}
    scenario.pop("samples_per_client", None)
    fed = build_federation(load_dataset("digits"), scenario, 0)
    pairs = {frozenset(np.unique(c.train_y).tolist()) for c in fed.clients}
    assert pairs == {frozenset({d, (d + 1) % 10}) for d in range(10)}
