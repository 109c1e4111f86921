"""Building a run: config -> federation, model, algorithm, executor and the algorithm's Setup.

Everything a runtime needs before its first round; the round loop (`sim/simulation.py`) and the
Flower nodes (`flower/node.py`) call these, so a node builds its data and model as the
simulator does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from clusterfed import config as cfg
from clusterfed.algorithms import Setup, build_algorithm
from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.secret import read_secret_file
from clusterfed.data import Federation, build_federation, load_dataset, own
from clusterfed.data.scenarios.drift import refuse_drift
from clusterfed.errors import ConfigError
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.choice import build_executor, choose
from clusterfed.sim.executor import Executor
from clusterfed.tasks import TrainSpec


def train_spec(train: Mapping[str, Any]) -> TrainSpec:
    return TrainSpec(lr=float(train["lr"]), batch_size=int(train["batch_size"]),
                     epochs=train["local_epochs"], steps=train["local_steps"],
                     momentum=float(train["momentum"]), weight_decay=float(train["weight_decay"]),
                     clip_grad_norm=train["clip_grad_norm"], optimizer=str(train["optimizer"]),
                     adam_beta1=float(train["adam_betas"][0]),
                     adam_beta2=float(train["adam_betas"][1]), adam_eps=float(train["adam_eps"]),
                     optimizer_state=str(train["optimizer_state"]))


def initial_params(module: torch.nn.Module, seed: int) -> None:
    """Re-initialise `module` in place from `seed`, leaving the global generator untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for m in module.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()


_DRAW_TAG = 0x1D2A


def initial_draws(module: torch.nn.Module, seed: int, first: np.ndarray,
                  transform: ParameterTransform | None) -> Callable[[int], np.ndarray]:
    """Setup.draw_initial: draw i > 0 re-initialises a copy of `module` from (seed, i)."""
    def draw(index: int) -> np.ndarray:
        if index == 0:
            return first.copy()
        fresh = copy.deepcopy(module)
        initial_params(fresh, int(np.random.SeedSequence([seed, index, _DRAW_TAG])
                                  .generate_state(1)[0]))
        vector = FlatModel(fresh).initial_vector().numpy()
        return vector if transform is None else transform.forward(vector)
    return draw


InitialModels = tuple[np.ndarray, Callable[[int], np.ndarray]]


def initial_models(module: torch.nn.Module, seed: int, transform: ParameterTransform | None
                   ) -> InitialModels:
    """The initial model as the server holds it (P-space under privacy) and Setup.draw_initial.

    `module` holds the initial weights. Wherever the privacy secret is, this is computed: in
    the simulator here, under Flower with client-held secrets on a node (`query.initial`).
    """
    initial = FlatModel(module).initial_vector().numpy()
    first = initial if transform is None else transform.forward(initial)
    return first, initial_draws(module, seed, first, transform)


def build_federation_for(config: Mapping[str, Any], data_dir: str | None = None) -> Federation:
    if config["data"]["dataset"] == own.FOLDERS:
        # Own data: the folders are the federation; no scenario applies.
        return own.federation_from_config(config["data"], config["seed"])
    data = dict(config["data"])
    name, root = data.pop("dataset"), data.pop("root", None)
    dataset = load_dataset(name, data_dir or root, **data)
    return build_federation(dataset, config["scenario"], config["seed"])


def privacy_transform(config: Mapping[str, Any], size: int, secret: bytes | None = None
                      ) -> ParameterTransform | None:
    """The clients' side of run.privacy for a model of `size` parameters, or None.

    The clients' shared secret, never in Setup: `secret` (a Flower node's own file), else the
    file run.privacy_secret_file names, else run.privacy_seed or a seed derived from the run's
    seed (both known to whoever holds the config).
    """
    run = config["run"]
    if run["privacy"] == "none":
        return None
    if secret is None and run.get("privacy_secret_file"):
        secret = read_secret_file(run["privacy_secret_file"])
    if secret is not None:
        if run["privacy_seed"] is not None:
            raise ConfigError("run.privacy_seed and a privacy secret file are both given: the "
                              "file is the clients' secret; drop run.privacy_seed")
        return ParameterTransform.from_secret(run["privacy"], secret, size)
    seed = run["privacy_seed"] if run["privacy_seed"] is not None else config["seed"] + 0x5EC
    return ParameterTransform.from_seed(run["privacy"], seed, size)


@dataclass
class Built:
    """The parts of one run, built from its config."""

    config: dict[str, Any]
    federation: Federation
    model: FlatModel
    algorithm: Any
    spec: TrainSpec
    executor: Executor
    owns_executor: bool
    setup: Setup
    # An executor like this one on another federation (a drift's); None for a given executor.
    executor_for: Callable[[Federation], Executor] | None = None
    # Torch's threads in this process during the run (sim/choice.py); None: torch's own.
    threads: int | None = None


def build_run(config: Mapping[str, Any], *, federation: Federation | None = None,
              data_dir: str | None = None, module: torch.nn.Module | None = None,
              executor: Executor | None = None,
              initial: Callable[[], InitialModels] | None = None) -> Built:
    """The run's parts. `module`, if given, replaces the config's model (its current weights
    are the start); `executor`, if given, runs the tasks instead of one built from run.*;
    `initial`, if given, supplies the initial models from where the privacy secret is."""
    config = cfg.resolve(config)
    federation = federation or build_federation_for(config, data_dir)
    seed = config["seed"]
    if module is None:
        module = build_model(**{"input_shape": federation.input_shape,
                                "n_classes": federation.n_classes, **config["model"]})
        initial_params(module, seed)
    model = FlatModel(module)
    algorithm = build_algorithm(config["algorithm"], config["newcomers"])
    spec = train_spec(config["train"])
    # Only the in-process executor needs the transform; a given one holds its own (or its
    # nodes do), so a server never derives one, let alone reads a secret file.
    transform = (privacy_transform(config, model.size)
                 if executor is None or initial is None else None)
    # The initial vector is read before the executor moves the module to its device.
    first, draw = (initial() if initial is not None
                   else initial_models(module, seed, transform))
    if first.shape != (model.size,):
        raise ConfigError(f"the initial model has shape {first.shape}; the model has "
                          f"{model.size} parameters")
    # An executor built here is closed here, when a run ends (worker processes stop);
    # a given one is its owner's to close.
    owns_executor = executor is None
    if not owns_executor:
        refuse_drift(config, "with a given executor (Flower)", federation)

    # Torch's threads now, before the run sets its own: a drift's executor is chosen alike.
    budget = torch.get_num_threads()

    def executor_for(data: Federation) -> Executor:
        choice = choose(config["run"], model, data, config["train"], budget)
        return build_executor(choice, model, data, seed, transform,
                              config["eval"]["validation_fraction"])

    threads = config["run"]["threads"] or None
    if executor is None:
        choice = choose(config["run"], model, federation, config["train"], budget)
        threads = choice.threads
        executor = build_executor(choice, model, federation, seed, transform,
                                  config["eval"]["validation_fraction"])
    # The layout is hidden under the privacy transform: coordinates are permuted there.
    layout = None if config["run"]["privacy"] != "none" else tuple(
        (n, tuple(s)) for n, s in zip(model.names, model.shapes, strict=True))
    setup = Setup(federation.num_clients, first, executor.train_sizes(), seed, layout,
                  draw_initial=draw)
    return Built(config, federation, model, algorithm, spec, executor, owns_executor, setup,
                 executor_for if owns_executor else None, threads)
