"""One client-side runtime: the clients' tensors, `run_task`, the device, the privacy transform.

The in-process executors (sequential, vectorised, each worker of the processes executor) and
every Flower node run their tasks through a `ClientRuntime`, so a task computes the same thing
wherever it runs: the same train/validation split, the same per-(round, step, client) generator,
the same evaluation code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import torch

from clusterfed.client.batched import evaluate_clients
from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.sgd import OptimizerState, state_arrays, state_from_arrays
from clusterfed.client.shared_tests import SharedTests, evaluate_shared, shared_tests
from clusterfed.client.work import run_task, train_task
from clusterfed.data.federation import Federation
from clusterfed.models.flat import FlatModel
from clusterfed.sampling import task_seed
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

Data = tuple[torch.Tensor, torch.Tensor]


def evaluate_result(task: ClientTask, loss: float, accuracy: float, num_samples: int
                    ) -> ClientResult:
    """The answer to a one-model EVALUATE task."""
    return ClientResult(task.client, TaskKind.EVALUATE, num_samples,
                        losses=np.array([loss]), accuracies=np.array([accuracy]), loss=loss,
                        meta=task.meta, task_id=task.id)


def keeps_optimizer_state(task: ClientTask) -> bool:
    """A TRAIN task whose optimiser continues the client's last one (train.optimizer_state)."""
    return (task.kind is TaskKind.TRAIN and task.train is not None
            and task.train.optimizer_state == "kept")


def one_model_evaluation(task: ClientTask) -> bool:
    return task.kind is TaskKind.EVALUATE and np.ndim(task.params) == 1


def evaluation_runs(tasks: Sequence[ClientTask]) -> list[list[int]]:
    """Indices of `tasks` in runs: consecutive one-model EVALUATE tasks that hold the same
    array on the same split form one run (scored together); every other task is a run alone."""
    runs: list[list[int]] = []
    for i, task in enumerate(tasks):
        last = tasks[runs[-1][-1]] if runs else None
        if (last is not None and one_model_evaluation(task) and one_model_evaluation(last)
                and task.params is last.params and task.split == last.split):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def test_key(x: torch.Tensor, y: torch.Tensor) -> bytes:
    """A digest of one client's test data: equal for equal arrays (shape, type and bytes)."""
    digest = hashlib.blake2b(digest_size=16)
    for t in (x, y):
        a = np.ascontiguousarray(t.detach().cpu().numpy())
        digest.update(f"{a.dtype}{a.shape}".encode())
        digest.update(a.view(np.uint8).reshape(-1))
    return digest.digest()


class ClientRuntime:
    """Clients' data as zero-copy tensors on one device, and one reusable model."""

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
        self.train: list[Data] = []
        self.validation: list[Data] = []
        for c in federation.clients:
            x = torch.from_numpy(c.train_x).to(self.device)
            y = torch.from_numpy(c.train_y).to(self.device)
            held = int(round(validation_fraction * len(y))) if validation_fraction else 0
            held = min(max(held, 1 if validation_fraction else 0), len(y) - 1)
            self.train.append((x[:len(y) - held], y[:len(y) - held]))
            self.validation.append((x[len(y) - held:], y[len(y) - held:]))
        self.test = [(torch.from_numpy(c.test_x).to(self.device),
                      torch.from_numpy(c.test_y).to(self.device)) for c in federation.clients]
        self._test_keys: list[bytes] | None = None   # filled by the first shared evaluation
        # The clients' distinct test samples where they overlap (`test: by_labels`), False
        # where they do not; None until a model is first scored on several distinct test sets.
        self._shared: SharedTests | bool | None = None
        # train.optimizer_state=kept: each client's optimiser state (momentum buffer or Adam's
        # moments, in plain space) after its last TRAIN task, by data index. It never leaves
        # the client runtime but for a checkpoint (`kept_states`).
        self.optimizer_states: dict[int, OptimizerState] = {}

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int = 0
            ) -> list[ClientResult]:
        """Every task's result, in task order; one model sent to many clients' EVALUATE tasks
        goes through the model once for them all."""
        results: list[ClientResult] = []
        for run in evaluation_runs(tasks):
            first = tasks[run[0]]
            if len(run) == 1:
                results.append(self.run_as(first, first.client, round_index, step))
                continue
            clients = [tasks[i].client for i in run]
            figures = self.evaluate(first.params, clients, first.split)
            data = self.test if first.split == "test" else self.validation
            results += [evaluate_result(tasks[i], float(loss), float(acc), len(data[c][1]))
                        for i, c, (loss, acc) in zip(run, clients, figures, strict=True)]
        return results

    def run_as(self, task: ClientTask, data: int, round_index: int, step: int = 0
               ) -> ClientResult:
        """One task on the data held at index `data`, with the task's client's generator.

        In-process both are the client; a Flower node holds one client's data at its own index.
        """
        if one_model_evaluation(task):
            held = self.test if task.split == "test" else self.validation
            (loss, acc), = self.evaluate(task.params, [data], task.split)
            return evaluate_result(task, float(loss), float(acc), len(held[data][1]))
        generator = self.generator(task.client, round_index, step)
        tested = self.test[data] if task.split == "test" else self.validation[data]
        plain = task if self.transform is None else replace(
            task, params=self.transform.inverse(task.params),
            objective=task.objective and task.objective.map_vectors(self.transform.inverse))
        if keeps_optimizer_state(task):
            result, self.optimizer_states[data] = train_task(
                self.model, plain, self.train[data], generator, self.device,
                self.optimizer_states.get(data))
        else:
            result = run_task(self.model, plain, self.train[data], tested, generator,
                              self.device)
        if self.transform is not None and result.update is not None:
            result = replace(result, update=self.transform.forward(result.update))
        return result

    def kept_states(self) -> dict[int, dict[str, np.ndarray]]:
        """Every client's kept optimiser state as arrays (`client.sgd.state_arrays`)."""
        return {c: state_arrays(st) for c, st in self.optimizer_states.items()}

    def restore_kept_states(self, states: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        """Replace the kept optimiser states with `states` (as `kept_states` gives them)."""
        self.optimizer_states = {int(c): state_from_arrays(a, self.device)
                                 for c, a in states.items()}

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
        (`client.batched.evaluate_clients`), not one client at a time; a test sample several
        of them hold (`test: by_labels`), once (`client.shared_tests`).
        """
        if self.transform is not None:
            params = self.transform.inverse(params)
        w = torch.as_tensor(params).to(self.device)
        data = self.test if split == "test" else self.validation
        keep, back = self._distinct(clients) if split == "test" else (list(clients), None)
        figures = self._evaluate_shared(w, keep) if split == "test" else None
        if figures is None:
            figures = evaluate_clients(self.model, w, [data[c] for c in keep]).reshape(-1, 2)
        return figures if back is None else figures[back]

    def _evaluate_shared(self, w: torch.Tensor, clients: Sequence[int]) -> np.ndarray | None:
        """The clients' figures with each test sample they share scored once, or None where
        they share too few (`client.shared_tests`)."""
        if len(clients) < 2:
            return None
        if self._shared is None:
            self._shared = shared_tests(self.test, self._set_keys()) or False
        if self._shared is False:
            return None
        return evaluate_shared(self.model, w, self._shared, clients)

    def _distinct(self, clients: Sequence[int]) -> tuple[list[int], np.ndarray | None]:
        """Clients holding the same test data (a scenario's `test: all`: CFL scores every
        client of a cluster on the whole test set) are scored once: the first of each, in
        order, and where each client's figures are among theirs (None: all distinct)."""
        if len(clients) < 2:
            return list(clients), None
        keys = self._set_keys()
        first: dict[bytes, int] = {}
        keep: list[int] = []
        back = np.empty(len(clients), dtype=np.int64)
        for i, c in enumerate(clients):
            key = keys[c]
            if key not in first:
                first[key] = len(keep)
                keep.append(c)
            back[i] = first[key]
        return keep, (None if len(keep) == len(clients) else back)

    def _set_keys(self) -> list[bytes]:
        """A digest of each client's whole test set, computed at the first shared evaluation."""
        if self._test_keys is None:
            self._test_keys = [test_key(x, y) for x, y in self.test]
        return self._test_keys
