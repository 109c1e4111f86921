"""The process executor: one single-threaded worker process per core, each running its share of
a round's tasks through its own `ClientRuntime` (`client/runtime.py`).

Two threads of one process split each small convolution and wait for each other at every
layer (and, when other jobs share the cores, spin while the other is descheduled); two
single-threaded processes each training their own clients keep both cores busy
(docs/speed.md). Results never depend on which process runs a task: each task draws from
its own generator (`sim.sampling.task_seed`), and every worker computes with one thread.

- Start: workers start at the first `run` and live until `close()` (the Simulation closes its
  executor when a run ends, also on an exception or KeyboardInterrupt). They come from a
  forkserver on Linux, from spawn elsewhere, never from a plain fork of this process: once
  torch has run here its OpenMP pool exists, and a forked child inherits that pool's state
  but not its threads (GNU OpenMP can hang in the child), along with any lock another thread
  held (logging, tqdm's monitor). The forkserver is a clean single-threaded process that
  imports torch once and forks each worker from there.
- Data: the clients' arrays are copied once into one shared-memory block that every worker
  maps; a worker's ClientRuntime holds zero-copy tensors of it (`sim/shared.py`).
- Tasks and results: a call writes its tasks' arrays (each distinct one once: FedAvg's global
  model is one array for all clients) to a shared block, and sends each worker its tasks with
  array slots in their place; a worker writes its results' arrays to a block of its own.
- Balance: tasks are handed out by expected cost (samples through the model, `task_cost`),
  longest first, in shrinking chunks to whichever worker is idle (`chunks`); results come
  back in task order.
- Evaluation (`evaluate`) of one model over many clients' test data runs here, with one
  thread: the evaluation is a small part of a round, and two threads of one process on a
  machine that other jobs keep busy wait for each other at every barrier (measured:
  docs/speed.md).
- Errors: a task that raises in a worker raises `WorkerError` here, with the worker's
  traceback; a worker that dies takes the pool down and raises `WorkerError`.

With `grouped=True` (`run.executor=grouped` with `run.workers` of 2 or more) each worker runs
the grouped executor (`sim/grouped.py`) instead: the round's training tasks are split once,
by cost, into one share a worker, and each worker trains its share as one wider model; the
results then equal sequential's to float tolerance, as the grouped executor's do.

Modules whose forward pass changes state or draws random numbers (batch-norm statistics,
dropout) make a task's result depend on the tasks its process ran before and on the
process's global generator; their tasks run here, sequentially, with a logged notice.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import os
import pickle
import re
import signal
import sys
import traceback
import weakref
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.runtime import ClientRuntime, keeps_optimizer_state, one_model_evaluation
from clusterfed.data.federation import ClientData, Federation
from clusterfed.models.flat import FlatModel
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.shared import (
    ALIGN,
    Block,
    Layout,
    Mailbox,
    Reader,
    flatten,
    nbytes_of,
    unflatten,
)
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

log = logging.getLogger("clusterfed")

# Samples' worth of fixed cost per SGD step (Python, kernel launches): it matters only for
# balancing clients of different sizes, so a rough figure does.
STEP_OVERHEAD = 8
# Seconds a worker gets to leave after "stop" before it is terminated.
STOP_SECONDS = 10.0


class WorkerError(RuntimeError):
    """A task raised in a worker process, or a worker process died."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


def process_obstacle(module: nn.Module) -> str | None:
    """Why tasks on `module` cannot run in worker processes, or None: results that would depend
    on the process (state, global random numbers), or workers that could not start."""
    return state_obstacle(module) or start_obstacle(module)


def state_obstacle(module: nn.Module) -> str | None:
    """Why `module`'s results would depend on the process that trains it, or None."""
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            return f"layer {name or 'model'} keeps running statistics ({type(m).__name__})"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"layer {name or 'model'} is dropout (the process's global generator)"
    return None


# `if __name__ == "__main__":`, the guard that keeps a script's run out of its workers.
_MAIN_GUARD = re.compile(r"""__name__\s*==\s*["']__main__["']""")


def needs_main(payload: bytes) -> bool:
    """Whether a pickle refers to the main module (a class defined in the script or the
    interactive session): only then must a worker import the main script."""
    return b"__main__" in payload


def start_obstacle(module: nn.Module) -> str | None:
    """Why workers could not start on `module`, or None.

    Workers start without the main script (`main_hidden`) unless the pickled module refers to
    it; then, as under spawn, each worker imports the script (as `__mp_main__`), so a script
    whose run is not guarded by `if __name__ == "__main__":` would run again in every worker,
    and a class defined in an interactive session (no script to import) cannot be found.
    """
    try:
        payload = pickle.dumps(module)
    except Exception as err:   # a lambda or a local class in the model
        return f"the model does not pickle ({type(err).__name__}: {err})"
    if not needs_main(payload):
        return None
    main = sys.modules.get("__main__")
    if getattr(main, "__spec__", None) is not None:     # python -m ...: importable
        return None
    script = getattr(main, "__file__", None)
    if script is None:
        return "the model's class is defined in an interactive session"
    try:
        guarded = _MAIN_GUARD.search(Path(script).read_text(errors="replace"))
    except OSError:
        guarded = None
    if not guarded:
        return (f"the model's class is defined in the main script {script}, which has no "
                f"`if __name__ == \"__main__\":` guard")
    return None


@contextmanager
def main_hidden(hide: bool) -> Iterator[None]:
    """While workers start, hide the main module's file and spec from multiprocessing, so
    that a worker does not import (run again) the main script when it needs nothing of it."""
    main = sys.modules.get("__main__")
    if not hide or main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def task_cost(task: ClientTask, train_size: int, test_size: int) -> float:
    """A task's expected cost in samples through the model (a backward pass counts two)."""
    models = task.params.shape[0] if np.ndim(task.params) == 2 else 1
    if task.kind is TaskKind.TRAIN and task.train is not None:
        steps = task.train.num_steps(train_size)
        per_step = 3 * (min(task.train.batch_size, train_size) + STEP_OVERHEAD)
        maml = task.objective.maml if task.objective is not None else None
        return steps * per_step * {None: 1, "fo": 2, "hf": 4}[maml]
    if task.kind is TaskKind.GRADIENT:
        return 3.0 * train_size
    if task.kind is TaskKind.LOSSES:
        n = train_size + (test_size if task.loss is not None and task.loss.data == "train+test"
                          else 0)
        if task.loss is not None and task.loss.max_samples is not None:
            n = min(n, task.loss.max_samples)
        return float(models * n)
    if task.kind is TaskKind.EVALUATE:
        return float(models * test_size)
    return float(train_size)   # SIGNATURE: a decomposition of the client's data


def chunks(costs: Sequence[float], workers: int) -> list[list[int]]:
    """Task indices in the order they are handed out: longest first, in chunks of about half a
    worker's share of the cost still to go (guided self-scheduling; at least one task), each
    chunk in task order.

    Each idle worker takes the next chunk, so a worker slowed by another job on its core gets
    less, and the short tasks at the end even out the finish; a static split would wait for
    the slowest worker. A few dozen messages a call even for thousands of tiny tasks.
    """
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    remaining = float(sum(costs))
    out: list[list[int]] = []
    i = 0
    while i < len(order):
        target = remaining / (2 * workers)
        chunk, size = [order[i]], float(costs[order[i]])
        i += 1
        while i < len(order) and size + costs[order[i]] <= target:
            chunk.append(order[i])
            size += costs[order[i]]
            i += 1
        remaining -= size
        out.append(sorted(chunk))
    return out


def shares(costs: Sequence[float], workers: int) -> list[list[int]]:
    """One share of task indices a worker, of about equal cost (longest first, each to the
    least loaded share), each in task order: what grouped workers take, since a group pays
    only when it is large."""
    load = [0.0] * workers
    out: list[list[int]] = [[] for _ in range(workers)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        w = min(range(workers), key=lambda w: (load[w], w))
        out[w].append(i)
        load[w] += costs[i]
    return [sorted(share) for share in out if share]


def result_bytes(task: ClientTask) -> int:
    """Room for a task's result arrays: an update the model's size, or a few per-model figures.
    (A SIGNATURE's matrix may not fit: it then travels through the pipe.)"""
    if task.kind in (TaskKind.TRAIN, TaskKind.GRADIENT):
        body = task.params.nbytes
    else:
        body = 16 * (task.params.shape[0] if np.ndim(task.params) == 2 else 1)
    return body + 2 * ALIGN


def start_context() -> BaseContext:
    """A forkserver on Linux, spawn elsewhere (see the module's docstring)."""
    if sys.platform.startswith("linux"):
        ctx = mp.get_context("forkserver")
        # The server imports torch and this module once; each worker forks from it. (Only
        # effective before the process's forkserver starts.)
        ctx.set_forkserver_preload([__name__])
        return ctx
    return mp.get_context("spawn")


# --------------------------------------------------------------------------------------------
# The worker's side
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs to build its ClientRuntime, sent once when it starts."""

    module: bytes                   # the pickled nn.Module
    seed: int
    transform: ParameterTransform | None
    validation_fraction: float
    data: Layout                    # train_x, train_y, test_x, test_y of each client, in turn
    n_classes: int
    input_shape: tuple[int, ...]
    grouped: bool = False           # each worker runs the grouped executor on its share
    notice_level: int = logging.WARNING   # of the grouped executor's sequential fallbacks


def _federation(setup: WorkerSetup, views: list[np.ndarray]) -> Federation:
    clients = [ClientData(*views[i:i + 4]) for i in range(0, len(views), 4)]
    return Federation(clients, np.zeros(len(clients), dtype=np.int64), setup.n_classes,
                      setup.input_shape)


def worker_main(conn: Connection, setup: WorkerSetup) -> None:
    """A worker's life: build the executor on the shared data, then serve calls until "stop"
    or until the parent is gone."""
    # Ctrl-C reaches every process of the terminal's group; the parent decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    data = Reader()
    tasks, results = Reader(), Reader()
    try:
        module = pickle.loads(setup.module)
        federation = _federation(setup, data.read(setup.data))
        if setup.grouped:
            # Imported here: a plain worker never needs it.
            from clusterfed.sim.grouped import GroupedExecutor
            executor: ClientRuntime = GroupedExecutor(
                FlatModel(module), federation, setup.seed, setup.transform,
                setup.validation_fraction, notice_level=setup.notice_level)
        else:
            executor = ClientRuntime(FlatModel(module), federation, setup.seed,
                                     setup.transform, setup.validation_fraction)
        conn.send(("ready", os.getpid()))
    except BaseException:
        conn.send(("setup_failed", traceback.format_exc()))
        return
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:   # the parent is gone
                break
            if message[0] == "stop":
                break
            try:
                reply = _serve(executor, tasks, results, *message[1:], together=setup.grouped)
            except Exception:   # outside any one task: reading the call, writing results
                reply = ("failed", message[1], "the worker could not serve the call",
                         traceback.format_exc())
            conn.send(reply)
    finally:
        # The views into the blocks go first, so that the blocks can be unmapped.
        del executor, federation
        gc.collect()
        for reader in (tasks, results, data):
            reader.close()


def _serve(executor: ClientRuntime, tasks_in: Reader, results_out: Reader, call: int,
           round_index: int, step: int, layout: Layout, records: list[Any], result_block: str,
           *, together: bool = False) -> tuple[Any, ...]:
    """One call: run its tasks (one by one; a grouped worker all at once), write the results'
    arrays back."""
    tasks = unflatten(records, tasks_in.read(layout))
    done: list[ClientResult] = []
    batches = [tasks] if together else [[t] for t in tasks]
    for batch in batches:
        try:
            done += executor.run(batch, round_index, step)
        except Exception as err:
            who = (f"client {batch[0].client}'s {batch[0].kind.value} task" if len(batch) == 1
                   else f"the tasks of clients {[t.client for t in batch]}")
            what = (f"{who} (round {round_index + 1}, step {step}): "
                    f"{type(err).__name__}: {err}")
            return ("failed", call, what, traceback.format_exc())
    out, arrays = flatten(done)
    block = results_out.open(result_block)
    if nbytes_of(arrays) <= block.capacity:
        return ("done", call, out, block.write(arrays), None)
    return ("done", call, out, None, arrays)   # too large for the block: through the pipe


# --------------------------------------------------------------------------------------------
# The parent's side
# --------------------------------------------------------------------------------------------


class _Pool:
    """Running workers, their pipes and the shared blocks of one run."""

    def __init__(self, setup: WorkerSetup, data: Block, workers: int) -> None:
        ctx = start_context()
        self.processes: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self.data = data
        self.tasks = Mailbox()
        self.results = [Mailbox() for _ in range(workers)]
        self.calls = 0
        self.grouped = setup.grouped
        self.idle = False   # until every worker is ready: a failed start terminates them
        try:
            for i in range(workers):
                here, there = ctx.Pipe()
                self.conns.append(here)
                process = ctx.Process(target=worker_main, args=(there, setup), daemon=True,
                                      name=f"clusterfed-worker-{i}")
                with main_hidden(not needs_main(setup.module)):
                    process.start()
                there.close()
                self.processes.append(process)
            for w in range(workers):
                reply = self._reply(w)
                if reply[0] != "ready":
                    raise WorkerError(f"worker {w} could not start:\n{reply[1]}")
        except BaseException:
            self.close()
            raise
        self.idle = True
        # Every worker has mapped the data: the name can go, the memory stays while mapped.
        self.data.unlink()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def _died(self, w: int) -> WorkerError:
        p = self.processes[w]
        p.join(1.0)
        return WorkerError(f"worker {w} (pid {p.pid}) died (exit code {p.exitcode})")

    def _reply(self, w: int) -> tuple[Any, ...]:
        """The next message of worker `w`; WorkerError if it dies first."""
        conn, process = self.conns[w], self.processes[w]
        while not conn.poll():
            wait([conn, process.sentinel])
            if not conn.poll() and not process.is_alive():
                raise self._died(w)
        try:
            return conn.recv()
        except (EOFError, OSError):   # the other end closed: reset or end of file
            raise self._died(w) from None

    def run(self, tasks: Sequence[ClientTask], costs: Sequence[float], round_index: int,
            step: int) -> list[ClientResult]:
        self.calls += 1
        records, arrays = flatten(tasks)
        layout = self.tasks.write([np.ascontiguousarray(a) for a in arrays])
        split = shares if self.grouped else chunks
        queue = deque(split(costs, len(self.processes)))
        out: list[ClientResult | None] = [None] * len(tasks)
        failures: list[str] = []
        busy: dict[int, list[int]] = {}

        def hand_out(w: int) -> None:
            share = queue.popleft()
            block = self.results[w].reserve(sum(result_bytes(tasks[i]) for i in share))
            busy[w] = share
            try:
                self.conns[w].send(("run", self.calls, round_index, step, layout,
                                    [records[i] for i in share], block.name))
            except OSError:
                raise self._died(w) from None

        self.idle = False
        for w in range(len(self.processes)):
            if queue:
                hand_out(w)
        # Every busy worker answers before anything is raised, so the pool stays in step.
        while busy:
            ready = set(wait([x for w in busy
                              for x in (self.conns[w], self.processes[w].sentinel)]))
            for w in sorted(busy):
                if self.conns[w] not in ready and self.processes[w].sentinel not in ready:
                    continue
                share = busy.pop(w)
                reply = self._reply(w)   # a worker that died raises here
                if reply[1] != self.calls:
                    raise WorkerError(f"worker {w} answered call {reply[1]} in call {self.calls}")
                if reply[0] == "failed":
                    failures.append(f"{reply[2]}\n--- in worker {w} ---\n{reply[3]}")
                    continue
                _, _, results, result_layout, inline = reply
                # Copies: the block is written again by the worker's next chunk.
                copies = ([a.copy() for a in self.results[w].reserve(0).read(result_layout)]
                          if result_layout is not None else inline)
                for i, result in zip(share, unflatten(results, copies), strict=True):
                    out[i] = result
                if queue and not failures:
                    hand_out(w)
        self.idle = True
        if failures:
            raise WorkerError(failures[0])
        assert all(r is not None for r in out)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the workers (ask when idle, terminate when not) and free the blocks."""
        if self.idle:
            for conn in self.conns:
                try:
                    conn.send(("stop",))
                except OSError:
                    pass
            for p in self.processes:
                p.join(STOP_SECONDS)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(STOP_SECONDS)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()
        self.data.unlink()
        self.tasks.unlink()
        for box in self.results:
            box.unlink()


@contextmanager
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
        self._pool: _Pool | None = None
        # Stops the pool if this executor is dropped or the interpreter exits unclosed.
        self._finalizer: weakref.finalize | None = None
        self.started_pids: list[int] = []   # every worker ever started (tests check them)

    def __enter__(self) -> ProcessExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> _Pool:
        arrays = [a for c in self.federation.clients
                  for a in (c.train_x, c.train_y, c.test_x, c.test_y)]
        data = Block.create(nbytes_of(arrays))
        try:
            setup = WorkerSetup(
                pickle.dumps(self.local.model.module), self.seed, self.transform,
                self.validation_fraction, data.write(arrays), self.federation.n_classes,
                tuple(self.federation.input_shape), self.grouped, self.notice_level)
            data.close()   # the workers map it; this process keeps the federation's arrays
            pool = _Pool(setup, data, self.workers)
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
