"""`ProcessExecutor`: the Executor that runs a call's tasks in the worker pool, and one-model
evaluations and kept-state training in this process (the package's docstring)."""

from __future__ import annotations

import logging
import pickle
import weakref
from collections.abc import Mapping, Sequence

import numpy as np

from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.runtime import keeps_optimizer_state, one_model_evaluation
from clusterfed.data.federation import Federation
from clusterfed.models.flat import FlatModel
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.processes.policy import one_thread, process_obstacle, usable_cores
from clusterfed.sim.processes.pool import Pool, WorkerError
from clusterfed.sim.processes.schedule import task_cost
from clusterfed.sim.processes.worker import WorkerSetup
from clusterfed.sim.shared import Block, nbytes_of
from clusterfed.tasks import ClientResult, ClientTask

log = logging.getLogger("clusterfed")


class ProcessExecutor:
    """Runs client tasks in `workers` single-threaded worker processes (default: one per usable
    core), each through the grouped executor if `grouped`; evaluates in this process. Close it
    (or use it as a context manager) to stop them."""

    def __init__(self, model: FlatModel, federation: Federation, seed: int,
                 transform: ParameterTransform | None = None,
                 validation_fraction: float = 0.0, workers: int | None = None,
                 grouped: bool = False, notice_level: int = logging.WARNING) -> None:
        # This process's own executor: evaluation, sizes, and models workers cannot share.
        self.local = SequentialExecutor(model, federation, seed, transform, validation_fraction)
        self.federation = federation
        self.seed = seed
        self.transform = transform
        self.validation_fraction = validation_fraction
        self.grouped = grouped
        self.notice_level = notice_level
        self.workers = workers or usable_cores()
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        self.obstacle = process_obstacle(model.module)
        if self.obstacle:
            log.warning("process executor: %s; running tasks in this process", self.obstacle)
        self._pool: Pool | None = None
        # Stops the pool if this executor is dropped or the interpreter exits unclosed.
        self._finalizer: weakref.finalize | None = None
        self.started_pids: list[int] = []   # every worker ever started (tests check them)

    def __enter__(self) -> ProcessExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> Pool:
        arrays = [a for c in self.federation.clients
                  for a in (c.train_x, c.train_y, c.test_x, c.test_y)]
        data = Block.create(nbytes_of(arrays))
        try:
            setup = WorkerSetup(
                pickle.dumps(self.local.model.module), self.seed, self.transform,
                self.validation_fraction, data.write(arrays), self.federation.n_classes,
                tuple(self.federation.input_shape), self.grouped, self.notice_level)
            data.close()   # the workers map it; this process keeps the federation's arrays
            pool = Pool(setup, data, self.workers)
        except BaseException:
            data.unlink()
            raise
        self.started_pids += pool.pids
        log.info("process executor: %d %sworkers started (pids %s)", self.workers,
                 "grouped " if self.grouped else "", pool.pids)
        return pool

    def _costs(self, tasks: Sequence[ClientTask]) -> list[float]:
        return [task_cost(t, len(self.local.train[t.client][1]), len(self.local.test[t.client][1]))
                for t in tasks]

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int = 0
            ) -> list[ClientResult]:
        if not tasks:
            return []
        if self.obstacle:
            return self.local.run(tasks, round_index, step)
        # One model over many clients' test data is scored here (see `evaluate`); so is training
        # that continues a client's kept optimiser state, which lives in this process.
        here = [i for i, t in enumerate(tasks)
                if one_model_evaluation(t) or keeps_optimizer_state(t)]
        kept = set(here)
        there = [i for i in range(len(tasks)) if i not in kept]
        results: list[ClientResult | None] = [None] * len(tasks)
        for part, run in ((here, self._in_parent), (there, self._in_pool)):
            if part:
                for i, result in zip(part, run([tasks[i] for i in part], round_index, step),
                                     strict=True):
                    results[i] = result
        return results  # type: ignore[return-value]   (in task order, as the workers answer)

    def _in_parent(self, tasks: Sequence[ClientTask], round_index: int, step: int
                   ) -> list[ClientResult]:
        """One-model evaluations and kept-state training, here, with one thread (see
        `evaluate`)."""
        with one_thread():
            return self.local.run(tasks, round_index, step)

    def _in_pool(self, tasks: Sequence[ClientTask], round_index: int, step: int
                 ) -> list[ClientResult]:
        if self._pool is None:
            try:
                self._pool = self._start()
            except BaseException:
                self.close()
                raise
            self._finalizer = weakref.finalize(self, self._pool.close)
        try:
            return self._pool.run(tasks, self._costs(tasks), round_index, step)
        except WorkerError:
            if not self._pool.idle:   # a worker died: the pool is gone
                self.close()
            raise
        except BaseException:   # KeyboardInterrupt, a broken pipe: no worker outlives it
            self.close()
            raise

    def evaluate(self, params: np.ndarray, clients: Sequence[int], split: str = "test"
                 ) -> np.ndarray:
        """One model over many clients' data, here, with one thread like the workers: the
        run then equals a one-thread sequential run bit for bit, and other jobs on the cores
        cannot stall it (threads that share a busy core spin at every barrier)."""
        with one_thread():
            return self.local.evaluate(params, clients, split)

    def kept_states(self) -> dict[int, dict[str, np.ndarray]]:
        return self.local.kept_states()

    def restore_kept_states(self, states: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        self.local.restore_kept_states(states)

    def train_sizes(self) -> np.ndarray:
        return self.local.train_sizes()

    def test_sizes(self) -> np.ndarray:
        return self.local.test_sizes()

    def close(self) -> None:
        """Stop the workers and free the shared memory; a later `run` starts new ones."""
        self._pool = None
        if self._finalizer is not None:
            self._finalizer()   # the pool's close, once
            self._finalizer = None
