"""One client's side of a run: its data built from the scenario, and the simulator's executor.

A node knows only its partition id (Flower's node config) and the run's config (sent with every
message). It builds the federation exactly as the simulator does and serves one client of it
through a `SequentialExecutor`, so a task runs here with the same code, the same train/validation
split, the same privacy transform and the same per-(round, step, client) generator as in-process,
on the device `run.device` names (resolved on the node: `auto` is CUDA where the node sees one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from clusterfed import config as cfg
from clusterfed.client.tasks import ClientResult, ClientTask
from clusterfed.errors import ConfigError
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.choice import resolve_device
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.simulation import build_federation_for, privacy_transform

# Node config keys (flower-supernode --node-config 'partition-id=0 num-partitions=6').
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
DATA_DIR = "data-dir"


@dataclass(frozen=True)
class Population:
    """The federation as every node builds it, and one executor over all its clients."""

    executor: SequentialExecutor
    true_clusters: np.ndarray
    n_classes: int
    input_shape: tuple[int, ...]

    @property
    def num_clients(self) -> int:
        return len(self.true_clusters)

    @classmethod
    def build(cls, config: Mapping[str, Any], data_dir: str | None = None) -> Population:
        config = cfg.resolve(config)
        federation = build_federation_for(config, data_dir)
        module = build_model(**{"input_shape": federation.input_shape,
                                "n_classes": federation.n_classes, **config["model"]})
        model = FlatModel(module)
        # torch.from_numpy views: the executor holds the federation's arrays without copies.
        executor = SequentialExecutor(model, federation, config["seed"],
                                      privacy_transform(config, model.size),
                                      config["eval"]["validation_fraction"],
                                      device=resolve_device(str(config["run"]["device"])))
        return cls(executor, federation.true_clusters.copy(), federation.n_classes,
                   tuple(federation.input_shape))


@dataclass(frozen=True)
class ClientNode:
    """The client `partition` of a population: what a SuperNode serves."""

    partition: int
    population: Population

    @classmethod
    def of(cls, population: Population, partition: int, num_partitions: int | None = None
           ) -> ClientNode:
        n = population.num_clients
        if not 0 <= partition < n:
            raise ConfigError(f"node config {PARTITION_ID}={partition} is outside the "
                              f"federation's {n} clients (0..{n - 1})")
        if num_partitions is not None and num_partitions != n:
            raise ConfigError(f"node config {NUM_PARTITIONS}={num_partitions} differs from the "
                              f"scenario's {n} clients")
        return cls(partition, population)

    def describe(self) -> dict[str, Any]:
        """What the server needs before round 0: no data, only counts and the true cluster."""
        pop = self.population
        return {"partition": self.partition, "num_clients": pop.num_clients,
                "num_train": int(pop.executor.train_sizes()[self.partition]),
                "num_test": int(pop.executor.test_sizes()[self.partition]),
                "true_cluster": int(pop.true_clusters[self.partition]),
                "n_classes": pop.n_classes, "input_shape": list(pop.input_shape)}

    def run(self, task: ClientTask, round_index: int, step: int) -> ClientResult:
        if task.client != self.partition:
            raise ValueError(f"task for client {task.client} sent to the node serving "
                             f"client {self.partition}")
        return self.population.executor.run([task], round_index, step)[0]

    def evaluate(self, params: np.ndarray, client: int, split: str) -> tuple[float, float]:
        if client != self.partition:
            raise ValueError(f"evaluation of client {client} sent to the node serving "
                             f"client {self.partition}")
        loss, acc = self.population.executor.evaluate(params, [client], split)[0]
        return float(loss), float(acc)


# A process may serve many messages and, in Flower's simulation runtime, many nodes: build the
# population of a (config, data root) once; keep only the latest, one run at a time.
_POPULATIONS: dict[tuple[str, str | None], Population] = {}


def node_for(config_json: str, node_config: Mapping[str, Any]) -> ClientNode:
    """The node a Flower SuperNode's config and a message's run config describe."""
    if PARTITION_ID not in node_config:
        raise ConfigError(f"this SuperNode has no {PARTITION_ID} in its node config: start it "
                          f"with --node-config '{PARTITION_ID}=K {NUM_PARTITIONS}=N'")
    partition = int(node_config[PARTITION_ID])
    total = int(node_config[NUM_PARTITIONS]) if NUM_PARTITIONS in node_config else None
    data_dir = str(node_config[DATA_DIR]) if node_config.get(DATA_DIR) else None
    key = (config_json, data_dir)
    if key not in _POPULATIONS:
        config = json.loads(config_json)
        if config["run"]["threads"]:
            torch.set_num_threads(int(config["run"]["threads"]))
        _POPULATIONS.clear()
        _POPULATIONS[key] = Population.build(config, data_dir)
    return ClientNode.of(_POPULATIONS[key], partition, total)
