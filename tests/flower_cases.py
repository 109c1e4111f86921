"""The algorithms the Flower tests run, and their small scenario. Extend FLOWER_ALGORITHMS as
methods land: each entry is the `algorithm` config section of a run that the in-process
simulator and Flower must agree on (same clusters, same accuracies)."""

from __future__ import annotations

from typing import Any

from helpers import tiny_config

from clusterfed import config as cfg

FLOWER_ALGORITHMS: list[dict[str, Any]] = [
    {"name": "fedavg"},
    # eps1/eps2 large enough that CFL splits within two rounds of this small scenario.
    {"name": "cfl", "acceptance": "fixed", "eps1": 0.6, "eps2": 0.1},
    # The other clustered methods, each set to cluster within the two rounds.
    {"name": "flhc", "rounds_before_clustering": 1, "threshold_mode": "clusters",
     "threshold": 2},
    {"name": "pacfl", "n_clusters": 2},
    {"name": "lcfl", "k": 2, "warmup_rounds": 1},
    {"name": "ifca", "k": 2, "restarts": 1, "initialisation": "random"},
    {"name": "fesem", "k": 2, "select_round": 1},
    {"name": "flexcfl", "k": 2, "warmup_rounds": 0},
    # Per-sample losses with labels up, sample-weighted training down: the soft methods' door.
    {"name": "fedrc", "components": 2},
]

# The in-process Flower tests (the real ClientApp and wire format behind a loopback grid) run
# every registered algorithm; the real-network tests (`make test-flower`) run the clustered ones
# and FedAvg, since each real run costs a minute of process starts.
EVERY_ALGORITHM: list[dict[str, Any]] = [
    *FLOWER_ALGORITHMS,
    {"name": "ifca", "select_round": 1},      # k from the data: the selection round too
    {"name": "fedem", "components": 2},
    {"name": "fedsoft", "k": 2, "tau": 1},
    {"name": "fedprox", "mu": 0.01},
    {"name": "fednova"},
    {"name": "scaffold"},
    {"name": "lg_fedavg"},
    {"name": "per_fedavg"},
    {"name": "fedavg_ft"},
    {"name": "local"},
]

CLIENTS = 4


def flower_config(algorithm: dict[str, Any], rounds: int = 2, every: int | None = None
                  ) -> dict[str, Any]:
    """Digits with label swap, 4 clients in 2 true clusters, evaluated after the last round."""
    config = tiny_config(algorithm["name"],
                         scenario={"kind": "label_swap", "clients": CLIENTS, "clusters": 2},
                         train={"rounds": rounds, "participation": 1.0},
                         eval={"every": every or rounds},
                         # Flower's clients train on the sequential path: the simulator too,
                         # so the two runtimes agree bit for bit.
                         run={"progress": False, "checkpoint_every": 1, "threads": 1,
                              "executor": "sequential"})
    config["algorithm"] = dict(algorithm)
    return cfg.resolve(config)


def case_id(algorithm: dict[str, Any]) -> str:
    return str(algorithm["name"])
