"""A worker's life: build a ClientRuntime (or a grouped executor) on the shared data, then
serve the parent's calls, writing the results' arrays to the worker's own block."""

from __future__ import annotations

import gc
import logging
import os
import pickle
import signal
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.runtime import ClientRuntime
from clusterfed.data.federation import ClientData, Federation
from clusterfed.models.flat import FlatModel
from clusterfed.sim.shared import Layout, Reader, flatten, nbytes_of, unflatten
from clusterfed.tasks import ClientResult


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
