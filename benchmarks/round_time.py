"""Seconds per FedAvg round on MNIST with McMahan et al.'s CNN, against the matmul peak.

Also reports local-training images per second, and the GFLOP/s that training achieves as a
fraction of this machine's float32 matmul peak, measured in the same run.

The setting is the FedAvg paper's MNIST CNN: 100 iid clients of 600 training images, 10
clients per round, 1 local epoch, batch size 10 and 50. Rounds run through the simulator's
own round loop (`Simulation`), timed after one warm-up round, with no evaluation inside the
timed rounds.

    python benchmarks/round_time.py [--rounds N] [--quick] [--data-dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from common import default_data_dir, synthetic_mnist
from torch.utils.flop_counter import FlopCounterMode

from clusterfed.data import Dataset, Federation, build_federation, load_dataset
from clusterfed.errors import DataError
from clusterfed.models import FlatModel
from clusterfed.sampling import sample_clients
from clusterfed.sim.simulation import Simulation

SEED = 0
BATCH_SIZES = (10, 50)
CLIENTS = 100
TRAIN_PER_CLIENT = 600
CLIENTS_PER_ROUND = 10
QUICK_CLIENTS_PER_ROUND = 2   # not 1: participation 1 means the fraction 1.0, all clients
LOCAL_EPOCHS = 1
WARMUP_ROUNDS = 1
# The simulator evaluates every client once when a run ends; a small test share keeps that
# (untimed) evaluation from costing more than the benchmark itself.
TEST_PER_CLIENT = 10
MATMUL_SIZE = 2048


def load_mnist_or_synthetic(root: Path) -> tuple[Dataset, bool, str]:
    """(dataset, whether it is real MNIST, why not when it is not)."""
    try:
        return load_dataset("mnist", root), True, ""
    except DataError as err:
        return synthetic_mnist(SEED), False, str(err)


def matmul_peak_gflops(repeats: int) -> float:
    """Best-of-`repeats` float32 GFLOP/s of one square matmul, with torch's default threads."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    for _ in range(2):  # warm-up: thread pool start-up and first-touch page faults
        torch.matmul(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    # Best, not mean: on a shared machine the fastest run is the closest to the peak.
    return 2 * MATMUL_SIZE**3 / best / 1e9


def train_flops_per_image(model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> float:
    """FLOPs of one local SGD step (forward + backward, as client training runs it) per image."""
    w = model.initial_vector().requires_grad_(True)
    with FlopCounterMode(display=False) as counter:
        loss = F.cross_entropy(model(w, x), y)
        torch.autograd.grad(loss, w)
    return counter.get_total_flops() / len(y)


def config_for(batch_size: int, clients_per_round: int, rounds: int) -> dict[str, Any]:
    return {
        "seed": SEED,
        "data": {"dataset": "mnist", "root": None},
        "scenario": scenario(),
        "model": {"name": "fedavg_cnn"},
        "train": {"rounds": rounds, "participation": clients_per_round,
                  "local_epochs": LOCAL_EPOCHS, "batch_size": batch_size},
        "algorithm": {"name": "fedavg"},
        "eval": {"every": 10**9},
        "run": {"progress": False, "checkpoint_every": 0},
    }


def scenario() -> dict[str, Any]:
    return {"kind": "iid", "clients": CLIENTS, "samples_per_client": TRAIN_PER_CLIENT,
            "test_samples_per_client": TEST_PER_CLIENT}


def time_rounds(federation: Federation, batch_size: int, clients_per_round: int,
                timed_rounds: int) -> dict[str, Any]:
    """Run warm-up + timed rounds of FedAvg; seconds and training images of each timed round."""
    total = WARMUP_ROUNDS + timed_rounds
    stamps: list[float] = []

    def stamp(completed: int, record: Any) -> bool:
        stamps.append(time.perf_counter())
        return completed == total  # stop here

    # One round more than we stop after: the simulator always evaluates after the last
    # configured round, and that round is never reached.
    sim = Simulation(config_for(batch_size, clients_per_round, total + 1), None,
                     federation=federation, callbacks=[stamp])
    sim.run()  # its end-of-run evaluation comes after the last stamp, so it is not timed
    seconds = list(np.diff(stamps[WARMUP_ROUNDS - 1:]))
    sizes = federation.train_sizes()
    images = [LOCAL_EPOCHS * int(sizes[sample_clients(SEED, r, federation.num_clients,
                                                      clients_per_round)].sum())
              for r in range(WARMUP_ROUNDS, total)]
    client0 = federation.clients[0]
    flops = train_flops_per_image(sim.model, torch.from_numpy(client0.train_x[:batch_size]),
                                  torch.from_numpy(client0.train_y[:batch_size]))
    return {"batch_size": batch_size, "clients_per_round": clients_per_round,
            "round_seconds": [float(s) for s in seconds],
            "images_per_round": images, "train_flops_per_image": flops}


def summarise(run: dict[str, Any], peak_gflops: float) -> dict[str, Any]:
    seconds = sum(run["round_seconds"])
    images = sum(run["images_per_round"])
    gflops = run["train_flops_per_image"] * images / seconds / 1e9
    return {**run,
            "seconds_per_round": seconds / len(run["round_seconds"]),
            "median_seconds_per_round": statistics.median(run["round_seconds"]),
            "images_per_second": images / seconds,
            "train_gflops_per_second": gflops,
            "fraction_of_matmul_peak": gflops / peak_gflops}


def print_table(rows: list[dict[str, Any]], peak_gflops: float) -> None:
    header = (f"{'batch':>5}  {'clients/rnd':>11}  {'s/round':>8}  {'median s':>8}  "
              f"{'images/s':>9}  {'MFLOP/img':>9}  {'GFLOP/s':>8}  {'of peak':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['batch_size']:>5}  {r['clients_per_round']:>11}  "
              f"{r['seconds_per_round']:>8.3f}  {r['median_seconds_per_round']:>8.3f}  "
              f"{r['images_per_second']:>9.1f}  {r['train_flops_per_image'] / 1e6:>9.2f}  "
              f"{r['train_gflops_per_second']:>8.2f}  {r['fraction_of_matmul_peak']:>7.1%}")
    print(f"float32 matmul peak ({MATMUL_SIZE}x{MATMUL_SIZE}, best run): {peak_gflops:.2f} GFLOP/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder holding mnist/raw/ (default: $CLUSTERFED_SHARED_DATA, "
                             "else ../shared/data beside the repository)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per batch size")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke check: 1 timed round, {QUICK_CLIENTS_PER_ROUND} clients "
                             "per round")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    timed_rounds = 1 if args.quick else args.rounds
    clients_per_round = QUICK_CLIENTS_PER_ROUND if args.quick else CLIENTS_PER_ROUND

    root = args.data_dir or default_data_dir()
    dataset, real, why = load_mnist_or_synthetic(root)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"python {sys.version.split()[0]}")
    if real:
        print(f"data: real MNIST from {root}")
    else:
        print(f"data: SYNTHETIC random uint8 images of MNIST's shape (real MNIST not usable: "
              f"{why})")
    print(f"FedAvg, fedavg_cnn, {CLIENTS} iid clients x {TRAIN_PER_CLIENT} images, "
          f"{clients_per_round} clients/round, {LOCAL_EPOCHS} local epoch, "
          f"{WARMUP_ROUNDS} warm-up + {timed_rounds} timed rounds"
          + (" (--quick)" if args.quick else ""))

    # Measured in the same process, just before training, so both see the same machine load.
    peak = matmul_peak_gflops(repeats=3 if args.quick else 10)
    federation = build_federation(dataset, scenario(), SEED)
    rows = [summarise(time_rounds(federation, b, clients_per_round, timed_rounds), peak)
            for b in BATCH_SIZES]
    print()
    print_table(rows, peak)
    if not real:
        print("NOTE: these figures come from SYNTHETIC data, not real MNIST")

    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "real_mnist": real, "quick": args.quick, "warmup_rounds": WARMUP_ROUNDS,
            "timed_rounds": timed_rounds, "clients": CLIENTS,
            "train_per_client": TRAIN_PER_CLIENT, "local_epochs": LOCAL_EPOCHS,
            "matmul_size": MATMUL_SIZE, "matmul_peak_gflops": peak, "results": rows,
        }, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
