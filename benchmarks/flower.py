"""Seconds per FedAvg round: clusterfed's simulator against Flower's simulation runtime (Ray).

The same task on both, in the same run: MNIST, McMahan et al.'s CNN, 100 iid clients of 600
images, 10 clients per round, 1 local epoch of SGD at batch 10. Flower runs its own
`run_simulation` with a ServerApp (its FedAvg strategy) and a ClientApp (benchmarks/
flower_apps.py), one client at a time per CPU that torch may use here; clusterfed runs
`Simulation` with the sequential executor (or whatever `run.executor=auto` picks). Rounds are
timed after one warm-up round (Ray's start and each actor's data loading are not counted).
Needs `flwr[simulation]==1.41.0`; without it, prints a skip line.

    python benchmarks/flower.py [--rounds N] [--batch-size B]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import machine, mnist

from clusterfed.data import build_federation
from clusterfed.sim.simulation import Simulation

SEED = 0
CLIENTS, PER_CLIENT, PER_ROUND, LR = 100, 600, 10, 0.05
HERE = Path(__file__).resolve().parent


def ours(rounds: int, batch: int) -> list[float]:
    dataset, _ = mnist()
    federation = build_federation(dataset, {"kind": "iid", "clients": CLIENTS,
                                            "samples_per_client": PER_CLIENT,
                                            "test_samples_per_client": 1}, SEED)
    stamps = [time.perf_counter()]

    def stamp(completed: int, record: Any) -> bool:
        stamps.append(time.perf_counter())
        return completed == rounds + 1

    config = {"seed": SEED, "data": {"dataset": "mnist"},
              "scenario": {"kind": "iid", "clients": CLIENTS},
              "model": {"name": "fedavg_cnn"},
              "train": {"rounds": rounds + 2, "participation": PER_ROUND, "local_epochs": 1,
                        "batch_size": batch, "lr": LR},
              "algorithm": {"name": "fedavg"}, "eval": {"every": 10**9},
              "run": {"progress": False, "checkpoint_every": 0}}
    Simulation(config, federation=federation, callbacks=[stamp]).run()
    return list(np.diff(stamps)[1:])   # without the warm-up round


def flower(rounds: int, batch: int) -> list[float]:
    from flwr.app import ArrayRecord, ConfigRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    # Ray's workers import the ClientApp module and benchmarks/common.py from here.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.path.insert(0, str(HERE))
    from flower_apps import app as client_app

    from clusterfed.models import build_model

    stamps: list[float] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        module = build_model("fedavg_cnn", (1, 28, 28), 10)
        strategy = FedAvg(fraction_train=PER_ROUND / CLIENTS, fraction_evaluate=0.0,
                          min_train_nodes=PER_ROUND, min_available_nodes=CLIENTS)

        def evaluate(server_round: int, arrays: ArrayRecord) -> None:
            stamps.append(time.perf_counter())   # after each round (and before the first)
            return None

        strategy.start(grid=grid, initial_arrays=ArrayRecord(module.state_dict()),
                       num_rounds=rounds + 1, evaluate_fn=evaluate,
                       train_config=ConfigRecord({"lr": LR, "batch-size": batch,
                                                  "clients": CLIENTS, "per-client": PER_CLIENT,
                                                  "seed": SEED}))

    cpus = torch.get_num_threads()
    run_simulation(server_app=server, client_app=client_app, num_supernodes=CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": cpus, "include_dashboard": False}})
    return list(np.diff(stamps)[1:])   # stamps[0]: before round 1; round 1 is the warm-up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (after 1 warm-up)")
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args(argv)
    print("== FedAvg seconds per round: clusterfed vs Flower simulation (Ray) ==")
    print(machine())
    print(mnist()[1])
    try:
        import flwr
    except ImportError:
        print("SKIP flower: flwr is not installed (pip install 'flwr[simulation]==1.41.0')")
        return 0
    print(f"MNIST, fedavg_cnn, {CLIENTS} iid clients x {PER_CLIENT}, {PER_ROUND}/round, "
          f"1 epoch, batch {args.batch_size}; 1 warm-up + {args.rounds} timed rounds each; "
          f"flwr {flwr.__version__}, Ray with {torch.get_num_threads()} CPU(s), 1 per client")
    mine = ours(args.rounds, args.batch_size)
    theirs = flower(args.rounds, args.batch_size)
    a, b = float(np.mean(mine)), float(np.mean(theirs))
    print(f"{'runtime':<22} {'s/round':>8}  rounds")
    print(f"{'clusterfed':<22} {a:>8.3f}  {[round(float(s), 2) for s in mine]}")
    print(f"{'flower (ray)':<22} {b:>8.3f}  {[round(float(s), 2) for s in theirs]}")
    print(f"flower / clusterfed: {b / a:.2f}x  (goal >= 5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
