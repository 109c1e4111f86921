"""Time to build LCFL's dissimilarity matrix d, and what its exchange moves per client.

Building d takes M^2 model evaluations: each of M clients scores all M warm-up models on its
own data (one LOSSES task, the client's row of Eq. 2). Here each client holds 200 synthetic
1x28x28 images (the same work per image as MNIST) and the model is CNNFEMnist_Tiny (417,482
parameters), as at the paper's Rotated MNIST m = 1200.

A row is timed through the clients' own task code (`run_task` with a 2-D LOSSES task). When
all M rows would take too long, `--rows` of them are timed and the whole matrix is
extrapolated as M x (seconds per row): the output says which figures are measured and which
extrapolated. The assembly of d from the rows (`loss_distance.assemble`) is timed in full.
One row is also timed through the vectorised executor's path (`client.batched.evaluate_models`,
models vmapped in chunks of MIN_ROWS samples a model or more) beside the same path at one
image a call, which is what it did when M exceeded its chunk of about 1,000 rows.

Two faster paths are timed too: the grouped executor's (`sim.grouped.evaluate_grouped`: the M
models as one grouped model over the client's data, the first layer reading it once), one
row; and the process executor (`--workers` single-threaded workers, each scoring whole rows
through the clients' task code), `--rows` rows at M up to `--processes-max` (the (M, d) stack
goes to shared memory each call: 2 GB at M = 1200), extrapolated beyond from its rows per
second at the largest M timed. The bound: the forward FLOPs of M^2 x images image-model
pairs (FlopCounterMode) over the float32 matmul peak measured here at 1 and 2 threads.

    python benchmarks/lcfl_matrix.py [--clients 120 1200] [--rows N] [--images 200]
                                     [--threads 1] [--workers 2] [--processes-max 120]
                                     [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from clusterfed.algorithms.lcfl import loss_distance as ld
from clusterfed.client import batched
from clusterfed.client.work import run_task
from clusterfed.data.federation import ClientData, Federation
from clusterfed.models import FlatModel, build_model
from clusterfed.models.grouped import GroupedModel
from clusterfed.sim.grouped import evaluate_grouped, widest_activation
from clusterfed.sim.processes import ProcessExecutor
from clusterfed.tasks import ClientTask, TaskKind

MODEL = "cnn_femnist_tiny"
FLOAT_BYTES = 4


def client_data(images: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(images, 1, 28, 28, generator=gen),
            torch.randint(0, 10, (images,), generator=gen))


def time_rows(model: FlatModel, stacked: np.ndarray, rows: int, images: int) -> list[float]:
    """Seconds of each of `rows` clients' LOSSES task over all stacked models."""
    seconds = []
    for client in range(rows):
        data = client_data(images, client)
        task = ClientTask(client, TaskKind.LOSSES, stacked)
        began = time.perf_counter()
        result = run_task(model, task, data, data, torch.Generator().manual_seed(client))
        seconds.append(time.perf_counter() - began)
        assert result.losses is not None and len(result.losses) == len(stacked)
    return seconds


def time_vectorised_row(model: FlatModel, stacked: np.ndarray, images: int, min_rows: int
                        ) -> float:
    """Seconds of one client's row through evaluate_models with `min_rows` samples a model."""
    x, y = client_data(images, 0)
    w = torch.from_numpy(stacked)
    kept, batched.MIN_ROWS = batched.MIN_ROWS, min_rows
    try:
        began = time.perf_counter()
        losses, _ = batched.evaluate_models(model, w, x, y)
        seconds = time.perf_counter() - began
    finally:
        batched.MIN_ROWS = kept
    assert len(losses) == len(stacked)
    return seconds


def time_grouped_row(model: FlatModel, stacked: np.ndarray, images: int) -> float:
    """Seconds of one client's row through the grouped executor's path."""
    x, y = client_data(images, 0)
    grouped = GroupedModel(model.module)
    widest = widest_activation(grouped, (1, 28, 28))
    evaluate_grouped(grouped, torch.from_numpy(stacked[:4]), x, y, widest)   # warm-up
    began = time.perf_counter()
    losses, _ = evaluate_grouped(grouped, torch.from_numpy(stacked), x, y, widest)
    seconds = time.perf_counter() - began
    assert len(losses) == len(stacked)
    return seconds


def time_processes(model: FlatModel, stacked: np.ndarray, rows: int, images: int,
                   workers: int, grouped: bool = False) -> float:
    """Seconds of `rows` clients' LOSSES tasks through `workers` worker processes (after a
    warm-up call that starts them); `grouped`: each worker scores a row's models as one
    grouped model (`run.executor=grouped`, `run.workers`)."""
    clients = [ClientData(*(t.numpy() for t in (*client_data(images, c), *client_data(1, c))))
               for c in range(rows)]
    federation = Federation(clients, np.zeros(rows, dtype=np.int64), 10, (1, 28, 28))
    with ProcessExecutor(model, federation, 0, workers=workers, grouped=grouped) as executor:
        executor.run([ClientTask(c, TaskKind.LOSSES, stacked[:2]) for c in range(rows)], 0)
        tasks = [ClientTask(c, TaskKind.LOSSES, stacked) for c in range(rows)]
        began = time.perf_counter()
        executor.run(tasks, 0)
        return time.perf_counter() - began


def forward_flops_per_image(model: FlatModel) -> float:
    x, y = client_data(8, 0)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        F.cross_entropy(model(model.initial_vector(), x), y)
    return counter.get_total_flops() / len(y)


def matmul_peak(threads: int, size: int = 2048) -> float:
    """Best of 5 float32 GFLOP/s of one square matmul at `threads` threads."""
    kept = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(7):
        began = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - began)
    torch.set_num_threads(kept)
    return 2 * size**3 / best / 1e9


def measure(clients: int, rows: int, images: int, seed: int = 0, workers: int = 2,
            processes_max: int = 120, processes_rate: float | None = None,
            grouped_workers_rate: float | None = None,
            peaks: dict[int, float] | None = None) -> dict[str, Any]:
    module = build_model(name=MODEL, input_shape=(1, 28, 28), n_classes=10)
    model = FlatModel(module)
    base = model.initial_vector().numpy()
    rng = np.random.default_rng(seed)
    # The warm-up models (the cost does not depend on their values), filled in place: at
    # M = 1200 they take 2 GB.
    stacked = np.repeat(base[None], clients, axis=0)
    for row in stacked:
        row += 0.01 * rng.standard_normal(model.size, dtype=np.float32)
    rows = min(rows, clients)
    time_rows(model, stacked[:2], 1, images)            # warm the allocator and kernels up
    seconds = time_rows(model, stacked, rows, images)
    per_row = float(np.mean(seconds))
    vectorised = time_vectorised_row(model, stacked, images, batched.MIN_ROWS)
    one_image = time_vectorised_row(model, stacked, images, 1)
    grouped = time_grouped_row(model, stacked, images)
    if clients <= processes_max:
        proc_rows = max(rows, workers)
        processes_seconds = time_processes(model, stacked, proc_rows, images, workers)
        processes_rate = proc_rows * clients / processes_seconds   # model evaluations / s
        grouped_workers_seconds = time_processes(model, stacked, proc_rows, images, workers,
                                                 grouped=True)
        grouped_workers_rate = proc_rows * clients / grouped_workers_seconds
    flops = forward_flops_per_image(model)
    peaks = peaks or {1: matmul_peak(1), 2: matmul_peak(2)}
    halves = np.abs(rng.standard_normal((clients, clients)))
    began = time.perf_counter()
    ld.assemble(halves)
    assemble_s = time.perf_counter() - began
    model_bytes = model.size * FLOAT_BYTES
    return {
        "clients": clients, "images_per_client": images, "parameters": model.size,
        "rows_timed": rows, "rows_total": clients, "extrapolated": rows < clients,
        "seconds_per_row": per_row,
        "seconds_per_model_evaluation": per_row / clients,
        "images_per_second": clients * images / per_row,
        "matrix_seconds": per_row * clients + assemble_s,
        "slowest_client_seconds": per_row,
        "assemble_seconds": assemble_s,
        "vectorised_row_seconds": vectorised,
        "grouped_row_seconds": grouped,
        "grouped_matrix_seconds": grouped * clients + assemble_s,
        "processes_workers": workers,
        "processes_evaluations_per_second": processes_rate,
        "processes_extrapolated_from_smaller_m": clients > processes_max,
        "processes_matrix_seconds": (clients * clients / processes_rate
                                     if processes_rate else None),
        "grouped_workers_evaluations_per_second": grouped_workers_rate,
        "grouped_workers_matrix_seconds": (clients * clients / grouped_workers_rate
                                           if grouped_workers_rate else None),
        "forward_flops_per_image": flops,
        "matrix_flops": flops * images * clients * clients,
        "peak_gflops": peaks,
        "bound_seconds": {t: flops * images * clients * clients / (p * 1e9)
                          for t, p in peaks.items()},
        "vectorised_row_seconds_one_image_per_call": one_image,
        "model_evaluations": clients * clients,
        "download_bytes_per_client": (clients - 1) * model_bytes,
        "upload_bytes_per_client": (clients - 1) * FLOAT_BYTES,
        "download_bytes_total": clients * (clients - 1) * model_bytes,
        "server_memory_bytes": clients * model_bytes,
    }


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000:
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def duration(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[120, 1200])
    parser.add_argument("--rows", type=int, default=2,
                        help="client rows timed per M; the rest is extrapolated")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--processes-max", type=int, default=120,
                        help="largest M timed through worker processes; beyond, extrapolated")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"LCFL distance matrix: {MODEL}, {args.images} images per client, torch "
          f"{torch.__version__}, {args.threads} thread(s), load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    peaks = {1: matmul_peak(1), 2: matmul_peak(2)}
    print(f"float32 matmul peak: {peaks[1]:.1f} GFLOP/s at 1 thread, {peaks[2]:.1f} at 2")
    results: list[dict[str, Any]] = []
    rate = grouped_rate = None
    for m in sorted(args.clients):
        results.append(measure(m, args.rows, args.images, workers=args.workers,
                               processes_max=args.processes_max, processes_rate=rate,
                               grouped_workers_rate=grouped_rate, peaks=peaks))
        rate = results[-1]["processes_evaluations_per_second"]
        grouped_rate = results[-1]["grouped_workers_evaluations_per_second"]
    for r in results:
        how = (f"extrapolated from {r['rows_timed']} timed rows of {r['rows_total']}"
               if r["extrapolated"] else "all rows timed")
        print(f"\nM = {r['clients']}: {r['model_evaluations']:,} model evaluations of "
              f"{r['images_per_client']} images")
        print(f"  one client's row ({r['clients']} models): {r['seconds_per_row']:.2f} s "
              f"({1e3 * r['seconds_per_model_evaluation']:.1f} ms per model, "
              f"{r['images_per_second']:,.0f} images/s)")
        print(f"  whole d on one worker: {duration(r['matrix_seconds'])} ({how}); with one "
              f"worker per client: {duration(r['slowest_client_seconds'])}")
        print(f"  assembling d from the rows: {1e3 * r['assemble_seconds']:.1f} ms")
        chunked, single = (r["vectorised_row_seconds"],
                           r["vectorised_row_seconds_one_image_per_call"])
        print(f"  one row, vectorised: {chunked:.2f} s with >= {batched.MIN_ROWS} samples a "
              f"model per call, {single:.2f} s with one image per call "
              f"({single / chunked:.2f}x)")
        print(f"  one row, grouped: {r['grouped_row_seconds']:.2f} s; whole d "
              f"{duration(r['grouped_matrix_seconds'])} on one core ({how})")
        if r["processes_matrix_seconds"]:
            extra = (" (extrapolated from the rate at a smaller M)"
                     if r["processes_extrapolated_from_smaller_m"] else f" ({how})")
            print(f"  whole d, {r['processes_workers']} worker processes: "
                  f"{duration(r['processes_matrix_seconds'])}{extra}")
            if r["grouped_workers_matrix_seconds"]:
                print(f"  whole d, {r['processes_workers']} grouped worker processes: "
                      f"{duration(r['grouped_workers_matrix_seconds'])}{extra}")
        bound = r["bound_seconds"]
        print(f"  FLOP bound: {r['matrix_flops']:.3g} FLOPs "
              f"({r['forward_flops_per_image'] / 1e6:.2f} MFLOP a forward) -> "
              f"{duration(bound[1])} at 1 thread's peak, {duration(bound[2])} at 2 threads'")
        print(f"  per client: {human(r['download_bytes_per_client'])} down "
              f"({r['clients'] - 1} models of {human(r['parameters'] * FLOAT_BYTES)}), "
              f"{human(r['upload_bytes_per_client'])} up; all clients: "
              f"{human(r['download_bytes_total'])} down")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
