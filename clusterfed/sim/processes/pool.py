"""The parent's side of the workers: start them from a forkserver, hand out a call's tasks
by cost to whichever is idle, collect the results in task order, stop them."""

from __future__ import annotations

import multiprocessing as mp
import sys
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from clusterfed.sim.processes.policy import main_hidden, needs_main
from clusterfed.sim.processes.schedule import chunks, shares
from clusterfed.sim.processes.worker import WorkerSetup, worker_main
from clusterfed.sim.shared import ALIGN, Block, Mailbox, flatten, unflatten
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

# Seconds a worker gets to leave after "stop" before it is terminated.
STOP_SECONDS = 10.0


class WorkerError(RuntimeError):
    """A task raised in a worker process, or a worker process died."""


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


class Pool:
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
