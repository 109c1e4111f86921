"""One client's side of a run: its data, and the simulator's executor over it.

A node knows its node config and the run's config (sent with every message). It holds data in
one of two ways:

- **a scenario** (or a shared folder of client folders, `data.root`): it builds the federation
  exactly as the simulator does and serves its partition of it;
- **its own data** (node config `data-path`): the files there, read in the federation's agreed
  format (`data.dataset=folders`, `clusterfed.data.own`): no scenario, no partition, no truth.

Either way it serves one client through a `ClientRuntime` (`client/runtime.py`), as every in-
process executor does, so a task runs here with the same code, the same train/validation split,
the same privacy transform and the same per-(round, step, client) generator as in-process, on
the device `run.device` names (resolved on the node: `auto` is CUDA where the node sees one).
The client id, which seeds the generator, is the server's: it differs from the partition when
the server refused another node.

With `privacy-secret-file` in its node config, the privacy transform comes from that file, which
only the clients hold; the node then also answers the server's query for the initial models in
P-space, which the server cannot compute without the secret.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfed import config as cfg
from clusterfed.client.runtime import ClientRuntime
from clusterfed.client.secret import read_secret_file, secret_id
from clusterfed.client.sgd import state_arrays, state_from_arrays
from clusterfed.clustering.metrics import NO_TRUTH
from clusterfed.data import own
from clusterfed.data.federation import Federation
from clusterfed.data.scenarios.drift import refuse_drift
from clusterfed.errors import ClusterfedError, ConfigError
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.build import (
    build_federation_for,
    initial_models,
    initial_params,
    privacy_transform,
)
from clusterfed.sim.choice import resolve_device
from clusterfed.tasks import ClientResult, ClientTask

# Node config keys (flower-supernode --node-config 'partition-id=0 num-partitions=6 ...').
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
DATA_DIR = "data-dir"                # the data root a scenario's dataset is read from
DATA_PATH = "data-path"              # this node's own data (a folder or a file)
DATA_FORMAT = "data-format"          # its format, when not the run's data.format
SECRET_FILE = "privacy-secret-file"  # the clients' privacy secret, never sent to the server


@dataclass(frozen=True)
class NodeSettings:
    """What a SuperNode's node config says."""

    partition: int
    num_partitions: int | None = None
    data_dir: str | None = None
    data_path: str | None = None
    data_format: str | None = None
    secret_file: str | None = None

    @classmethod
    def of(cls, node_config: Mapping[str, Any]) -> NodeSettings:
        if PARTITION_ID not in node_config:
            raise ConfigError(f"this SuperNode has no {PARTITION_ID} in its node config: start "
                              f"it with --node-config '{PARTITION_ID}=K {NUM_PARTITIONS}=N'")

        def text(key: str) -> str | None:
            value = node_config.get(key)
            return str(value) if value not in (None, "") else None

        total = node_config.get(NUM_PARTITIONS)
        return cls(int(node_config[PARTITION_ID]), None if total is None else int(total),
                   text(DATA_DIR), text(DATA_PATH), text(DATA_FORMAT), text(SECRET_FILE))

    def private(self, reason: str) -> str:
        """`reason` without this node's paths: what it tells the server about a failure."""
        for key, value in ((DATA_PATH, self.data_path), (SECRET_FILE, self.secret_file)):
            if value:
                for form in {str(Path(value).expanduser()), value}:
                    reason = reason.replace(form, f"<{key}>")
        return reason


@dataclass(frozen=True)
class Population:
    """The data a node holds (a whole federation, or one client's own) and one executor."""

    config: dict[str, Any]
    federation: Federation
    executor: ClientRuntime
    own: bool = False       # one client's own data at index 0, not a federation
    secret_id: str = ""     # the id of the node's privacy secret ("" without one)

    @property
    def true_clusters(self) -> np.ndarray:
        return self.federation.true_clusters

    @property
    def n_classes(self) -> int:
        return self.federation.n_classes

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.federation.input_shape)

    @property
    def num_clients(self) -> int:
        return self.federation.num_clients

    @classmethod
    def build(cls, config: Mapping[str, Any], data_dir: str | None = None,
              secret: bytes | None = None) -> Population:
        """The scenario's federation (or data.root's client folders), as the simulator builds it."""
        config = cfg.resolve(config)
        refuse_drift(config, "under Flower")
        return cls._serving(config, build_federation_for(config, data_dir), False, secret)

    @classmethod
    def own_data(cls, config: Mapping[str, Any], path: str, fmt: str | None = None,
                 secret: bytes | None = None) -> Population:
        """One client's own files, read as the run's agreement says; its truth unknown."""
        config = cfg.resolve(config)
        if config["data"]["dataset"] != own.FOLDERS:
            raise ConfigError(f"this node serves its own data ({DATA_PATH}), but the run's "
                              f"data.dataset is {config['data']['dataset']!r}: a run over own "
                              f"data names data.dataset={own.FOLDERS}")
        agreement = own.agreement_from_config(config["data"], config["seed"])
        if agreement.n_classes is None or agreement.input_shape is None:
            raise ConfigError("a run over own data names data.n_classes and data.input_shape")
        options = agreement.options if fmt is None else replace(agreement.options, fmt=fmt)
        data = own.load_client_data(path, options)
        federation = Federation([data], np.full(1, NO_TRUTH, dtype=np.int64),
                                agreement.n_classes, agreement.input_shape,
                                {"dataset": own.FOLDERS})
        return cls._serving(config, federation, True, secret)

    @classmethod
    def _serving(cls, config: dict[str, Any], federation: Federation, own_data: bool,
                 secret: bytes | None) -> Population:
        module = build_model(**{"input_shape": federation.input_shape,
                                "n_classes": federation.n_classes, **config["model"]})
        model = FlatModel(module)
        # torch.from_numpy views: the executor holds the federation's arrays without copies.
        executor = ClientRuntime(model, federation, config["seed"],
                                      privacy_transform(config, model.size, secret),
                                      config["eval"]["validation_fraction"],
                                      device=resolve_device(str(config["run"]["device"])))
        return cls(config, federation, executor, own_data,
                   secret_id(secret) if secret is not None else "")


@dataclass(frozen=True)
class ClientNode:
    """The client a SuperNode serves: partition `partition` of a population, or its own data."""

    partition: int
    population: Population
    num_partitions: int | None = None

    @property
    def index(self) -> int:
        """Where this client's data is in the population."""
        return 0 if self.population.own else self.partition

    @classmethod
    def of(cls, population: Population, partition: int, num_partitions: int | None = None
           ) -> ClientNode:
        if population.own:
            # Own data has no partition to check here: the server checks it against the run.
            return cls(partition, population, num_partitions)
        n = population.num_clients
        if not 0 <= partition < n:
            raise ConfigError(f"node config {PARTITION_ID}={partition} is outside the "
                              f"federation's {n} clients (0..{n - 1})")
        if num_partitions is not None and num_partitions != n:
            raise ConfigError(f"node config {NUM_PARTITIONS}={num_partitions} differs from the "
                              f"scenario's {n} clients")
        return cls(partition, population, n)

    def describe(self) -> dict[str, Any]:
        """What the server needs before round 0: no data, only facts about it."""
        pop, i = self.population, self.index
        data = pop.federation.clients[i]
        classes = sorted({int(c) for c in np.unique(data.train_y)}
                         | {int(c) for c in np.unique(data.test_y)})
        facts: dict[str, Any] = {
            "partition": self.partition,
            "num_train": int(pop.executor.train_sizes()[i]),
            "num_test": int(pop.executor.test_sizes()[i]),
            "true_cluster": int(pop.true_clusters[i]),
            "input_shape": [int(s) for s in data.train_x.shape[1:]],
            "classes": classes,
            "privacy_secret_id": pop.secret_id}
        if self.num_partitions is not None:
            facts["num_clients"] = self.num_partitions
        if not pop.own:
            facts["n_classes"] = pop.n_classes     # a scenario's, which may relabel
        return facts

    def _addressed(self, client: int, partition: int | None) -> None:
        if partition is None and client != self.partition:
            raise ValueError(f"a message for client {client} sent to the node serving "
                             f"client {self.partition}")
        if partition is not None and partition != self.partition:
            raise ValueError(f"a message for partition {partition} sent to the node serving "
                             f"partition {self.partition}")

    def run(self, task: ClientTask, round_index: int, step: int,
            partition: int | None = None) -> ClientResult:
        self._addressed(task.client, partition)
        return self.population.executor.run_as(task, self.index, round_index, step)

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """This client's kept optimiser state, as arrays (for Flower's context.state)."""
        return state_arrays(self.population.executor.optimizer_states.get(self.index))

    def set_optimizer_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Continue from `arrays` (`optimizer_state`'s; {}: a fresh optimiser)."""
        executor = self.population.executor
        executor.optimizer_states[self.index] = state_from_arrays(arrays, executor.device)

    def initial(self, index: int) -> np.ndarray:
        """Draw `index` of the initial model, in P-space: what the server's Setup holds."""
        pop = self.population
        seed = pop.config["seed"]
        module = build_model(**{"input_shape": pop.input_shape, "n_classes": pop.n_classes,
                                **pop.config["model"]})
        initial_params(module, seed)
        first, draw = initial_models(module, seed, pop.executor.transform)
        return first if index == 0 else draw(index)


# A process may serve many messages and, in Flower's simulation runtime, many nodes: build the
# population of a (config, node settings) once; keep only the latest, one run at a time.
_POPULATIONS: dict[tuple[str, NodeSettings], Population] = {}


def population_for(config: Mapping[str, Any], settings: NodeSettings) -> Population:
    """The data a node's settings and a run's config make it serve."""
    secret = None
    if settings.secret_file and config["run"]["privacy"] != "none":
        secret = read_secret_file(settings.secret_file)
    if settings.data_path:
        return Population.own_data(config, settings.data_path, settings.data_format, secret)
    if config["data"]["dataset"] == own.FOLDERS and not config["data"].get("root"):
        raise ConfigError(f"the run is over own data (data.dataset={own.FOLDERS}): start this "
                          f"SuperNode with {DATA_PATH}=\"/path/to/its/data\" in its node config")
    return Population.build(config, settings.data_dir, secret)


def node_for(config_json: str, node_config: Mapping[str, Any]) -> ClientNode:
    """The node a Flower SuperNode's config and a message's run config describe."""
    settings = NodeSettings.of(node_config)
    key = (config_json, settings)
    if key not in _POPULATIONS:
        config = json.loads(config_json)
        if config["run"]["threads"]:
            torch.set_num_threads(int(config["run"]["threads"]))
        _POPULATIONS.clear()
        _POPULATIONS[key] = population_for(config, settings)
    return ClientNode.of(_POPULATIONS[key], settings.partition, settings.num_partitions)


def hello_facts(config_json: str, node_config: Mapping[str, Any]) -> dict[str, Any]:
    """The node's answer to hello: its facts, or its partition and why it cannot serve.

    A node that can name its partition says what is wrong rather than failing, so the server
    refuses it with a reason and goes on with the others; the reason names no local path.
    """
    try:
        return node_for(config_json, node_config).describe()
    except ClusterfedError as err:
        if PARTITION_ID not in node_config:
            raise
        print(f"[clusterfed] this node cannot serve the run: {err}", file=sys.stderr,
              flush=True)
        settings = NodeSettings.of(node_config)
        return {"partition": settings.partition, "problem": settings.private(str(err))}
