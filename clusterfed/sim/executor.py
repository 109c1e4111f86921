"""The sequential executor: one reusable model, pre-built tensors, tasks run one by one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.tasks import ClientResult, ClientTask
from clusterfed.client.work import evaluate, run_task
from clusterfed.data.scenarios import Federation
from clusterfed.models.flat import FlatModel
from clusterfed.sim.sampling import task_seed


class SequentialExecutor:
    """Runs client tasks in this process, sharing one module and zero-copy data tensors."""

    def __init__(self, model: FlatModel, federation: Federation, seed: int,
                 transform: ParameterTransform | None = None) -> None:
        self.model = model
        self.seed = seed
        # The clients' side of the privacy transform: parameters arrive in P-space.
        self.transform = transform
        # torch.from_numpy shares memory with the federation's arrays: no copies.
        self.train = [(torch.from_numpy(c.train_x), torch.from_numpy(c.train_y))
                      for c in federation.clients]
        self.test = [(torch.from_numpy(c.test_x), torch.from_numpy(c.test_y))
                     for c in federation.clients]

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int = 0
            ) -> list[ClientResult]:
        results = []
        for task in tasks:
            generator = torch.Generator().manual_seed(
                task_seed(self.seed, round_index, step, task.client))
            if self.transform is None:
                results.append(run_task(self.model, task, self.train[task.client],
                                        self.test[task.client], generator))
                continue
            plain = replace(task, params=self.transform.inverse(task.params))
            result = run_task(self.model, plain, self.train[task.client],
                              self.test[task.client], generator)
            if result.update is not None:
                result = replace(result, update=self.transform.forward(result.update))
            results.append(result)
        return results

    def evaluate(self, params: np.ndarray, clients: Sequence[int]) -> np.ndarray:
        """(loss, accuracy) of one model on each listed client's test data: shape (n, 2)."""
        if self.transform is not None:
            params = self.transform.inverse(params)
        w = torch.as_tensor(params)
        return np.array([evaluate(self.model, w, *self.test[c]) for c in clients],
                        dtype=np.float64).reshape(-1, 2)
