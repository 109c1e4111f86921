"""PACFL's default choice of K (`k_choice.selector: hdbscan_silhouette`) on the quick
benchmark's digits federations, signatures and the cut only: it keeps the rotations that
HDBSCAN alone merges in pairs, and says one cluster on iid and Dirichlet clients."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms import RoundContext
from clusterfed.experiments import benchmark as bench
from clusterfed.sim.build import build_federation_for
from clusterfed.sim.simulation import Simulation

SEEDS = (0, 1, 2)


def pacfl_clusters(scenario: str, seed: int, overrides: tuple[str, ...] = ()
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(true clusters, PACFL's clusters) after its signature round on the benchmark's cell."""
    config = bench.cell_config("digits", scenario, seed, "pacfl",
                               ["run.threads=1", *overrides])
    federation = build_federation_for(config)
    sim = Simulation(config, federation=federation)
    algo = sim.algorithm
    ctx = RoundContext(0, np.array([], dtype=np.int64), sim.spec)
    state = algo.init(sim.setup)
    state = algo.update(state, ctx, sim.executor.run(algo.plan(state, ctx), 0)).state
    return np.asarray(federation.true_clusters), state.assignment


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scenario", ["rotation", "rotation_unequal", "label_groups"])
def test_default_finds_the_clusters(scenario, seed):
    truth, found = pacfl_clusters(scenario, seed)
    assert adjusted_rand_score(truth, found) == 1.0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scenario", ["iid", "dirichlet"])
def test_default_says_one_cluster_without_clusters(scenario, seed):
    assert len(np.unique(pacfl_clusters(scenario, seed)[1])) == 1


@pytest.mark.parametrize("scenario", ["rotation", "rotation_unequal"])
def test_hdbscan_alone_merges_the_rotations(scenario):
    """Why the default is not HDBSCAN alone (the premise of the rule)."""
    truth, found = pacfl_clusters(scenario, 0, ("algorithm.k_choice.selector=hdbscan",))
    assert len(np.unique(found)) < len(np.unique(truth))
