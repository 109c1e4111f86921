"""Local training of a round's clients through each executor, interleaved in one sitting.

The same TRAIN tasks (every client from its own starting point, as in a clustered round) go
through: `sequential` with 1 and with 2 threads, `processes` (2 single-threaded workers),
`grouped-workers-2` (the grouped executor in 2 single-threaded workers),
`vmap` (the vectorised executor, 1 thread) and `grouped` (the clients as one wider model, 1
thread). Workloads, on MNIST (synthetic MNIST-shaped data where absent):

| name | model | clients x images | batch | epochs |
| --- | --- | --- | --- | --- |
| cfl-b128, cfl-b10 | cfl_convnet | 20 x 400 | 128, 10 | 1 |
| femnist-10, femnist-50 | cnn_femnist_tiny | 10 / 50 x 60 | 20 | 2 |
| fedavg-b10 | fedavg_cnn | 10 x 200 | 10 | 1 |

Each executor runs a warm-up call (which starts the workers of `processes`), then the
executors take turns, A B C D E then E D C B A, `--repeats` times; the figure kept is each
executor's best call. Per call: wall seconds, CPU seconds (this process and its workers,
from /proc), images/s and the share of the float32 matmul peak measured at the start (at 1
thread for single-threaded executors, 2 for the others) that the training FLOPs reach.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/batched.py [--workloads ...]
        [--executors ...] [--repeats 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import machine, mnist
from executors import cpu_seconds
from round_time import matmul_peak_gflops, train_flops_per_image

from clusterfed.data import build_federation
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.grouped import GroupedExecutor
from clusterfed.sim.processes import ProcessExecutor
from clusterfed.sim.simulation import initial_params
from clusterfed.sim.vectorised import VectorisedExecutor
from clusterfed.tasks import ClientTask, TaskKind, TrainSpec

SEED = 0
WORKLOADS: dict[str, tuple[str, int, int, int, int]] = {
    # name: model, clients, images per client, batch, epochs
    "cfl-b128": ("cfl_convnet", 20, 400, 128, 1),
    "cfl-b10": ("cfl_convnet", 20, 400, 10, 1),
    "femnist-10": ("cnn_femnist_tiny", 10, 60, 20, 2),
    "femnist-50": ("cnn_femnist_tiny", 50, 60, 20, 2),
    "fedavg-b10": ("fedavg_cnn", 10, 200, 10, 1),
}
# name: (executor class or None for worker processes, torch threads)
EXECUTORS: dict[str, tuple[type | None, int]] = {
    "sequential-1": (SequentialExecutor, 1),
    "sequential-2": (SequentialExecutor, 2),
    "processes-2": (None, 1),
    "vmap-1": (VectorisedExecutor, 1),
    "grouped-1": (GroupedExecutor, 1),
    "grouped-workers-2": (None, 1),   # the grouped executor in 2 single-threaded workers
}


def build(name: str, dataset: Any) -> tuple[dict[str, Any], list[ClientTask], int, float]:
    """Executors, tasks, images per call and training FLOPs per image of one workload."""
    model_name, clients, images, batch, epochs = WORKLOADS[name]
    federation = build_federation(dataset, {"kind": "iid", "clients": clients,
                                            "samples_per_client": images,
                                            "test_samples_per_client": 1}, SEED)
    module = build_model(model_name, federation.input_shape, federation.n_classes)
    initial_params(module, SEED)
    executors: dict[str, Any] = {}
    for label, (cls, _) in EXECUTORS.items():
        model = FlatModel(module)
        executors[label] = (ProcessExecutor(model, federation, SEED, workers=2,
                                            grouped=label.startswith("grouped"))
                            if cls is None else cls(model, federation, SEED))
    w0 = FlatModel(module).initial_vector().numpy()
    rng = np.random.default_rng(SEED)
    spec = TrainSpec(lr=0.05, batch_size=batch, epochs=epochs)
    tasks = [ClientTask(c, TaskKind.TRAIN,
                        (w0 + 0.01 * rng.standard_normal(w0.shape)).astype(np.float32), spec)
             for c in range(clients)]
    x = torch.from_numpy(federation.clients[0].train_x[:batch])
    y = torch.from_numpy(federation.clients[0].train_y[:batch])
    flops = train_flops_per_image(FlatModel(module), x, y)
    return executors, tasks, clients * images * epochs, flops


def timed(call: Callable[[], object], pids: list[int]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time() + cpu_seconds(pids)
    call()
    return time.perf_counter() - wall, time.process_time() + cpu_seconds(pids) - cpu


def measure(name: str, dataset: Any, labels: list[str], repeats: int,
            peaks: dict[int, float]) -> list[dict[str, Any]]:
    executors, tasks, images, flops = build(name, dataset)
    best: dict[str, tuple[float, float]] = {}
    try:
        for label in labels:                               # warm-up, workers started
            torch.set_num_threads(EXECUTORS[label][1])
            executors[label].run(tasks, 0)
        order = list(labels)
        for r in range(2 * repeats):
            for label in order if r % 2 == 0 else order[::-1]:
                torch.set_num_threads(EXECUTORS[label][1])
                pids = getattr(executors[label], "started_pids", [])
                wall, cpu = timed(lambda e=executors[label]: e.run(tasks, 0), pids)
                if label not in best or wall < best[label][0]:
                    best[label] = (wall, cpu)
    finally:
        for e in executors.values():
            if hasattr(e, "close"):
                e.close()
    rows = []
    for label in labels:
        wall, cpu = best[label]
        cores = 2 if label.endswith("-2") else 1
        rate = images / wall
        rows.append({"workload": name, "executor": label, "wall_s": wall, "cpu_s": cpu,
                     "images_per_s": rate, "mflop_per_image": flops / 1e6,
                     "gflops": rate * flops / 1e9, "peak_gflops": peaks[cores],
                     "of_peak": rate * flops / 1e9 / peaks[cores]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--executors", nargs="+", default=list(EXECUTORS), choices=EXECUTORS)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    dataset, where = mnist()
    peaks = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        peaks[threads] = matmul_peak_gflops(5)
    print(machine())
    print(where)
    print(f"matmul peak: {peaks[1]:.1f} GFLOP/s at 1 thread, {peaks[2]:.1f} at 2; "
          f"autogroup {Path('/proc/sys/kernel/sched_autogroup_enabled').read_text().strip()}")
    header = (f"{'workload':<11} {'executor':<13} {'wall s':>7} {'CPU s':>7} {'img/s':>8} "
              f"{'MFLOP/img':>9} {'of peak':>7} {'x seq-1':>7}")
    print(header)
    rows = []
    for name in args.workloads:
        load = os.getloadavg()[0]
        got = measure(name, dataset, args.executors, args.repeats, peaks)
        base = next((r["wall_s"] for r in got if r["executor"] == "sequential-1"), None)
        for r in got:
            r["load_before"] = load
            ratio = f"{base / r['wall_s']:7.2f}" if base else "      -"
            print(f"{name:<11} {r['executor']:<13} {r['wall_s']:7.3f} {r['cpu_s']:7.2f} "
                  f"{r['images_per_s']:8.0f} {r['mflop_per_image']:9.2f} "
                  f"{100 * r['of_peak']:6.1f}% {ratio}", flush=True)
        rows += got
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
