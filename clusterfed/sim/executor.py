"""The sequential executor: one reusable model, pre-built tensors, tasks run one by one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np
import torch

from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.tasks import ClientResult, ClientTask
from clusterfed.client.work import run_task
from clusterfed.data.federation import Federation
from clusterfed.models.flat import FlatModel
from clusterfed.sim.batched import evaluate_clients
from clusterfed.sim.sampling import task_seed


class Executor(Protocol):
    """Where client tasks run: this process (sequential, vectorised) or remote nodes (Flower)."""

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int = 0
            ) -> list[ClientResult]: ...

    def evaluate(self, params: np.ndarray, clients: Sequence[int], split: str = "test"
                 ) -> np.ndarray: ...

    def train_sizes(self) -> np.ndarray: ...

    def test_sizes(self) -> np.ndarray: ...


class SequentialExecutor:
    """Runs client tasks in this process, sharing one module and zero-copy data tensors."""

    def __init__(self, model: FlatModel, federation: Federation, seed: int,
                 transform: ParameterTransform | None = None,
                 validation_fraction: float = 0.0, device: str | torch.device = "cpu") -> None:
        self.model = model
        self.seed = seed
        # On an accelerator the module and every client's data move there once; on the CPU
        # `.to` returns the same tensors.
        self.device = torch.device(device)
        model.module.to(self.device)
        # The clients' side of the privacy transform: parameters arrive in P-space.
        self.transform = transform
        # torch.from_numpy shares memory with the federation's arrays: no copies.
        # The last `validation_fraction` of each client's (already shuffled) training data is
        # held out: it never trains, and selects among models (protocol best_of_path).
        self.train, self.validation = [], []
        for c in federation.clients:
            x = torch.from_numpy(c.train_x).to(self.device)
            y = torch.from_numpy(c.train_y).to(self.device)
            held = int(round(validation_fraction * len(y))) if validation_fraction else 0
            held = min(max(held, 1 if validation_fraction else 0), len(y) - 1)
            self.train.append((x[:len(y) - held], y[:len(y) - held]))
            self.validation.append((x[len(y) - held:], y[len(y) - held:]))
        self.test = [(torch.from_numpy(c.test_x).to(self.device),
                      torch.from_numpy(c.test_y).to(self.device)) for c in federation.clients]

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int = 0
            ) -> list[ClientResult]:
        return [self.run_as(task, task.client, round_index, step) for task in tasks]

    def run_as(self, task: ClientTask, data: int, round_index: int, step: int = 0
               ) -> ClientResult:
        """One task on the data held at index `data`, with the task's client's generator.

        In-process both are the client; a Flower node holds one client's data at its own index.
        """
        generator = self.generator(task.client, round_index, step)
        if self.transform is None:
            return run_task(self.model, task, self.train[data], self.test[data], generator,
                            self.device)
        plain = replace(task, params=self.transform.inverse(task.params),
                        objective=task.objective and task.objective.map_vectors(
                            self.transform.inverse))
        result = run_task(self.model, plain, self.train[data], self.test[data], generator,
                          self.device)
        if result.update is not None:
            result = replace(result, update=self.transform.forward(result.update))
        return result

    def generator(self, client: int, round_index: int, step: int) -> torch.Generator:
        """The random source of one client's task: its batch order or loss subsample."""
        return torch.Generator().manual_seed(task_seed(self.seed, round_index, step, client))

    def train_sizes(self) -> np.ndarray:
        return np.array([len(y) for _, y in self.train], dtype=np.int64)

    def test_sizes(self) -> np.ndarray:
        return np.array([len(y) for _, y in self.test], dtype=np.int64)

    def evaluate(self, params: np.ndarray, clients: Sequence[int], split: str = "test"
                 ) -> np.ndarray:
        """(loss, accuracy) of one model on each listed client's test (or validation) data.

        The clients' data go through the model together, in chunks of about 1,000 samples
        (`sim.batched.evaluate_clients`), not one client at a time.
        """
        if self.transform is not None:
            params = self.transform.inverse(params)
        w = torch.as_tensor(params).to(self.device)
        data = self.test if split == "test" else self.validation
        return evaluate_clients(self.model, w, [data[c] for c in clients]).reshape(-1, 2)
