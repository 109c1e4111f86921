"""Results stay unchanged: a short quickstart comparison against figures recorded before a refactor.

Every method of the quickstart's compare list runs a few rounds on the sequential executor with
one thread; a few clustered methods also run with options that make them cluster at once, so
their per-cluster code runs too. Each run's final assignment must match exactly, its per-client
accuracies, mean loss and a checksum of its cluster models (sum and sum of squares in float64)
to a relative 1e-6. CPUs with other vector instructions round differently (an AVX2 machine
gives other per-client accuracies than an AVX-512 one), so each instruction set torch uses
has its own fixture, `data/unchanged-<capability>.json`; where none is recorded the test
skips, saying so. To record one, on code whose results are trusted:
`python tests/test_unchanged.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clusterfed import config as cfg
from clusterfed.data import Federation
from clusterfed.experiments.compare import algorithm_sections
from clusterfed.sim.simulation import Simulation, build_federation_for

# torch's vector instruction set here: "AVX512", "AVX2", "DEFAULT", ...
CAPABILITY = torch.backends.cpu.get_cpu_capability()
FIXTURE = Path(__file__).parent / "data" / f"unchanged-{CAPABILITY}.json"
ROUNDS = 6
OVERRIDES = [f"train.rounds={ROUNDS}", "run.threads=1", "run.executor=sequential",
             "run.device=cpu", "run.progress=false", "run.checkpoint_every=0"]
# Options under which each clustered method forms several clusters within a few rounds.
CLUSTERING_NOW = {
    "cfl_split": {"name": "cfl", "rho": 1.0, "stagnation_window": 1, "acceptance": "fixed",
                  "gamma_max": 0.0},
    "flhc_k4": {"name": "flhc", "rounds_before_clustering": 1, "threshold_mode": "clusters",
                "threshold": 4},
    "ifca_k2": {"name": "ifca", "k": 2, "initialisation": "random"},
    "lcfl_k4": {"name": "lcfl", "warmup_rounds": 1, "k": 4},
    "pacfl_k4": {"name": "pacfl", "n_clusters": 4},
}
CLUSTERING_ROUNDS = 4


def quickstart() -> dict[str, Any]:
    return cfg.resolve("quickstart", OVERRIDES)


def run_sections() -> dict[str, dict[str, Any]]:
    """Each run's label and config, the quickstart's compare list first."""
    config = quickstart()
    runs = {str(s["name"]): cfg.merge(dict(config), {"algorithm": s})
            for s in algorithm_sections(config, None)}
    for label, section in CLUSTERING_NOW.items():
        runs[label] = cfg.merge(dict(config), {"algorithm": section,
                                               "train": {"rounds": CLUSTERING_ROUNDS}})
    return runs


def figures(run: dict[str, Any], federation: Federation) -> dict[str, Any]:
    """The figures a refactor must not change, from one run."""
    sim = Simulation(run, federation=federation)
    summary = sim.run()
    view = sim.algorithm.clusters(sim.state)
    models = view.models.astype(np.float64)
    return {"assignment": view.assignment.tolist(),
            "per_client_accuracy": summary["final"]["per_client_accuracy"],
            "mean_loss": summary["final"]["mean_loss"],
            "model_sum": float(models.sum()),
            "model_sum_of_squares": float(np.square(models).sum())}


def all_figures() -> dict[str, dict[str, Any]]:
    federation = build_federation_for(quickstart())
    return {label: figures(run, federation) for label, run in run_sections().items()}


@pytest.fixture(scope="module")
def current() -> dict[str, dict[str, Any]]:
    if not FIXTURE.exists():
        pytest.skip(f"no results recorded on a CPU with torch capability {CAPABILITY} "
                    f"({FIXTURE.name}): record them with `python tests/test_unchanged.py` "
                    f"on code whose results are trusted")
    return all_figures()


def test_every_run_is_recorded() -> None:
    fixtures = sorted(FIXTURE.parent.glob("unchanged-*.json"))
    assert fixtures
    for path in fixtures:
        assert sorted(run_sections()) == sorted(json.loads(path.read_text())), path.name


@pytest.mark.parametrize("label", list(run_sections()))
def test_results_unchanged(label: str, current: dict[str, dict[str, Any]]) -> None:
    want, got = json.loads(FIXTURE.read_text())[label], current[label]
    assert got["assignment"] == want["assignment"]
    for key in ("per_client_accuracy", "mean_loss", "model_sum", "model_sum_of_squares"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=0, err_msg=key)


if __name__ == "__main__":
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(all_figures(), indent=1) + "\n")
