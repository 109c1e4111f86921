"""PACFL's default cut on disjoint label groups of real images (issue 59's done-when): 2 to 6
groups of 2 or more labels, MNIST and Fashion-MNIST, 40 clients; signatures and the cut only,
no training. An iid federation gives one cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clusterfed import config as cfg
from clusterfed.algorithms import RoundContext
from clusterfed.clustering.metrics import clustering_scores
from clusterfed.data import Dataset, build_federation, load_dataset
from clusterfed.sim.simulation import Simulation

pytestmark = pytest.mark.shared_data

DATASETS = ("mnist", "fashion_mnist")
SEED = 0
CLIENTS = 40

# (groups, labels each): windows of the scenario's seeded label order.
EQUAL_GROUPS = [(2, 2), (2, 5), (3, 2), (3, 3), (4, 2), (5, 2)]
# 10 labels hold at most 5 disjoint pairs, so 6 groups need two of one label.
SIX_GROUPS = [[0, 1], [2, 3], [4, 5], [6, 7], [8], [9]]
UNEQUAL_GROUPS = [[0, 1], [2, 3, 4], [5, 6, 7, 8, 9]]


@pytest.fixture(scope="module")
def images(shared_data: Path) -> dict[str, Dataset]:
    return {name: load_dataset(name, shared_data) for name in DATASETS}


def pacfl_clusters(data: Dataset, scenario: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(true clusters, PACFL's default clustering) after its signature round."""
    section = {"clients": CLIENTS, "samples_per_client": 100, "test_samples_per_client": 10,
               **scenario}
    config = cfg.merge(cfg.DEFAULTS, {
        "seed": SEED, "data": {"dataset": data.name}, "scenario": section,
        "model": {"name": "mlp"}, "algorithm": {"name": "pacfl"},
        "run": {"progress": False, "threads": 1}})
    federation = build_federation(data, section, SEED)
    sim = Simulation(config, federation=federation)
    algo = sim.algorithm
    ctx = RoundContext(0, np.array([], dtype=np.int64), sim.spec)
    state = algo.init(sim.setup)
    state = algo.update(state, ctx, sim.executor.run(algo.plan(state, ctx), 0)).state
    return federation.true_clusters, state.assignment


def assert_groups_found(truth: np.ndarray, found: np.ndarray, groups: int) -> None:
    assert len(np.unique(found)) == groups
    assert clustering_scores(truth, found)["ari"] >= 0.95


@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("groups, labels", EQUAL_GROUPS)
def test_equal_label_groups_are_separated(images, dataset, groups, labels):
    truth, found = pacfl_clusters(images[dataset], {
        "kind": "label_groups", "clusters": groups, "labels_per_group": labels})
    assert_groups_found(truth, found, groups)


@pytest.mark.parametrize("dataset", DATASETS)
def test_six_label_groups_are_separated(images, dataset):
    truth, found = pacfl_clusters(images[dataset], {
        "kind": "label_groups", "clusters": 6, "group_labels": SIX_GROUPS})
    assert_groups_found(truth, found, 6)


@pytest.mark.parametrize("dataset", [
    "mnist",
    # Measured miss (docs/benchmark.md): 20 images a label in the 5-label group; the weighted
    # linkage tree holds no cut into the 3 groups (best ARI 0.91 at k = 4).
    pytest.param("fashion_mnist", marks=pytest.mark.xfail(
        strict=True, reason="PACFL's tree mixes the 3- and 5-label groups at seed 0")),
])
def test_label_groups_of_2_3_and_5_labels_are_separated(images, dataset):
    truth, found = pacfl_clusters(images[dataset], {
        "kind": "label_groups", "clusters": 3, "group_labels": UNEQUAL_GROUPS})
    assert_groups_found(truth, found, 3)


@pytest.mark.parametrize("dataset", DATASETS)
def test_iid_is_one_cluster(images, dataset):
    _, found = pacfl_clusters(images[dataset], {"kind": "iid", "clusters": 1})
    assert len(np.unique(found)) == 1
