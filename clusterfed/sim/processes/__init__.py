"""The process executor: one single-threaded worker process per core, each running its share of
a round's tasks through its own `ClientRuntime` (`client/runtime.py`).

Two threads of one process split each small convolution and wait for each other at every
layer (and, when other jobs share the cores, spin while the other is descheduled); two
single-threaded processes each training their own clients keep both cores busy
(docs/speed.md). Results never depend on which process runs a task: each task draws from
its own generator (`sampling.task_seed`), and every worker computes with one thread.

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

The package's modules: `policy.py` (what may run in workers, threads), `schedule.py` (task
costs, chunks, shares), `worker.py` (a worker's loop), `pool.py` (starting, feeding and stopping
the workers), `executor.py` (`ProcessExecutor`).
"""

from clusterfed.sim.processes.executor import ProcessExecutor
from clusterfed.sim.processes.policy import (
    one_thread,
    process_obstacle,
    start_obstacle,
    state_obstacle,
    usable_cores,
)
from clusterfed.sim.processes.pool import WorkerError
from clusterfed.sim.processes.schedule import chunks, shares, task_cost

__all__ = ["ProcessExecutor", "WorkerError", "chunks", "one_thread", "process_obstacle",
           "shares", "start_obstacle", "state_obstacle", "task_cost", "usable_cores"]
