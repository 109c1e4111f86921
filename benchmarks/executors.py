"""Seconds per round of the same workloads through each in-process executor, interleaved.

Executors: `sequential` with 1 and with 2 threads, `vectorised` (2 threads), `processes`
(2 single-threaded worker processes; evaluation in the parent with one thread), `grouped` with
1 and 2 threads and in 2 single-threaded workers, and `auto` with 2 threads and with 1 (the
default's pick on 2 cores and on one). Workloads:

- fedavg-b50, fedavg-b10: `round_time.py`'s FedAvg (McMahan et al.'s CNN, MNIST iid, 100
  clients x 600, 10 clients a round, 1 local epoch), batch 50 and batch 10; no evaluation;
- lenet-fedavg, lenet-fedprox, lenet-scaffold: PACFL's Table 1 round (LeNet-5, Fashion-MNIST
  in 20 % label skew, 100 clients x 600, 10 a round, batch 10) at 1 local epoch, no
  evaluation, under FedAvg, FedProx (mu 0.01), SCAFFOLD and Per-FedAvg (first order, PACFL's
  Table 3 alpha and beta), whose clients add a proximal pull or a control-variate correction
  to every step, or take meta steps of two batches;
- cfl-b128: the CFL reference workload, preset `cfl-mnist-labelswap-small` (MNIST label swap,
  20 clients in 4 clusters, `cfl_convnet`) at 400 images a client, batch 128, 1 local epoch,
  every client every round, evaluation after every round (timed with the round);
- cfl-b10: the same at batch 10 (small batch, small model);
- digits-b16: the tests' tiny run (8x8 digits, 8 clients, 4 a round of about 180 images, batch
  16, evaluation after every round), where a round is too short for workers to pay.

Each run goes through the simulator's round loop (`Simulation`): 1 warm-up round (for
`processes` it includes starting the workers; printed as `first s`) and then `--rounds` timed
rounds. Per timed round: wall seconds and CPU seconds of this process plus its workers (from
/proc). The executors take turns (A B C D, then B C D A, ...) `--repeats` times, so that
load drifting over the sitting touches each alike. Ratios are against sequential with 2 threads
(what a 2-core machine ran before, with torch's default threads), or where it did not run,
against the first executor named.

Data: MNIST from `--data-dir` (default: $CLUSTERFED_SHARED_DATA, else ../shared/data);
without it, scikit-learn's 8x8 digits with `digits_cnn` and clients scaled down to fit, which
only checks that the script runs.

    python benchmarks/executors.py [--workloads fedavg-b10 cfl-b128 ...] [--rounds N]
        [--repeats R] [--executors ...] [--data-dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import default_data_dir, machine

from clusterfed import config as cfg
from clusterfed.data import Federation, load_dataset
from clusterfed.errors import DataError
from clusterfed.sim.simulation import Simulation, build_federation_for

SEED = 0
EXECUTORS: dict[str, dict[str, Any]] = {
    "sequential-1": {"executor": "sequential", "threads": 1},
    "sequential-2": {"executor": "sequential", "threads": 2},
    "vectorised-2": {"executor": "vectorised", "threads": 2},
    "processes-2": {"executor": "processes", "threads": 2, "workers": 2},
    "grouped-1": {"executor": "grouped", "threads": 1},
    "grouped-2": {"executor": "grouped", "threads": 2},
    "grouped-workers-2": {"executor": "grouped", "threads": 2, "workers": 2},
    # The default: what `auto` picks on 2 cores and held to one thread (sim/choice.py).
    "auto-2": {"executor": "auto", "threads": 2},
    "auto-1": {"executor": "auto", "threads": 1},
}
BASELINE = "sequential-2"


def fedavg(batch: int) -> dict[str, Any]:
    return {"seed": SEED, "data": {"dataset": "mnist"},
            "scenario": {"kind": "iid", "clients": 100, "samples_per_client": 600,
                         "test_samples_per_client": 10},
            "model": {"name": "fedavg_cnn"},
            "train": {"participation": 10, "local_epochs": 1, "batch_size": batch},
            "algorithm": {"name": "fedavg"}, "eval": {"every": 10**9}}


def cfl(batch: int) -> dict[str, Any]:
    preset = cfg.resolve("cfl-mnist-labelswap-small")
    return cfg.merge(preset, {"scenario": {"samples_per_client": 400},
                              "train": {"local_epochs": 1, "batch_size": batch},
                              "eval": {"every": 1}})


def tiny() -> dict[str, Any]:
    """The tests' tiny run (tests/helpers.py): 8x8 digits, 8 clients, 4 a round, batch 16."""
    return {"seed": SEED, "data": {"dataset": "digits"},
            "scenario": {"kind": "label_swap", "clients": 8, "clusters": 4},
            "model": {"name": "digits_cnn"},
            "train": {"participation": 0.5, "local_epochs": 1, "batch_size": 16, "lr": 0.1},
            "algorithm": {"name": "fedavg"}, "eval": {"every": 1}}


def lenet(algorithm: dict[str, Any]) -> dict[str, Any]:
    """PACFL's Table 1 round (preset `pacfl-labelskew20-fmnist`: LeNet-5, Fashion-MNIST, 100
    clients x 600 in 20 % label skew, 10 a round, batch 10) at 1 local epoch, no evaluation,
    under `algorithm`."""
    preset = cfg.resolve("pacfl-labelskew20-fmnist")
    return {**cfg.merge(preset, {"train": {"local_epochs": 1}, "eval": {"every": 10**9}}),
            "algorithm": algorithm}


def rotmnist_mlp(algorithm: dict[str, Any]) -> dict[str, Any]:
    """FedSoft's and IFCA's rotated-MNIST round (preset `fedsoft-rotmnist`: MLP 784-200-10,
    100 clients x 150, all a round, batch 10) at 1 local epoch, no evaluation."""
    preset = cfg.resolve("fedsoft-rotmnist")
    return {**cfg.merge(preset, {"train": {"local_epochs": 1}, "eval": {"every": 10**9}}),
            "algorithm": algorithm}


WORKLOADS = {"fedavg-b50": fedavg(50), "fedavg-b10": fedavg(10),
             "lenet-fedavg": lenet({"name": "fedavg"}),
             "lenet-fedprox": lenet({"name": "fedprox", "mu": 0.01}),
             "lenet-scaffold": lenet({"name": "scaffold"}),
             "lenet-per-fedavg": lenet({"name": "per_fedavg", "alpha": 0.01, "beta": 0.001}),
             "mlp-fedavg": rotmnist_mlp({"name": "fedavg"}),
             "mlp-ifca": rotmnist_mlp({"name": "ifca", "k": 2, "restarts": 1}),
             "cfl-b128": cfl(128), "cfl-b10": cfl(10), "digits-b16": tiny()}


def on_digits(config: dict[str, Any]) -> dict[str, Any]:
    """The workload on 8x8 digits (MNIST absent): digits_cnn, clients scaled down to fit."""
    train = len(load_dataset("digits").train_y)
    clients = config["scenario"]["clients"]
    per_client = min(config["scenario"].get("samples_per_client") or 600, train // clients)
    return cfg.merge(config, {"data": {"dataset": "digits"}, "model": {"name": "digits_cnn"},
                              "scenario": {"samples_per_client": per_client,
                                           "test_samples_per_client": 2}})


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) of these live processes, from /proc (0 where gone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def one_run(config: dict[str, Any], federation: Federation, executor: dict[str, Any],
            rounds: int) -> dict[str, Any]:
    """1 warm-up + `rounds` timed rounds: wall and CPU seconds of each."""
    total = 1 + rounds
    # One round more than is run: the simulator always evaluates after the last configured
    # round, and that evaluation would otherwise fall in the last timed round.
    run = {"progress": False, "checkpoint_every": 0, **executor}
    sim = Simulation(cfg.merge(config, {"train": {"rounds": total + 1}, "run": run}), None,
                     federation=federation)

    def now() -> tuple[float, float]:
        pids = getattr(sim.executor, "started_pids", [])
        return time.perf_counter(), time.process_time() + cpu_seconds(pids)

    stamps = [now()]

    def stamp(completed: int, record: Any) -> bool:
        stamps.append(now())
        return completed == total

    sim.callbacks.append(stamp)
    sim.run()
    wall = [b[0] - a[0] for a, b in zip(stamps, stamps[1:], strict=False)]
    cpu = [b[1] - a[1] for a, b in zip(stamps, stamps[1:], strict=False)]
    return {"first": wall[0], "wall": wall[1:], "cpu": cpu[1:]}


def measure(name: str, config: dict[str, Any], federation: Federation, executors: list[str],
            rounds: int, repeats: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in executors}
    load_before = os.getloadavg()[0]
    for r in range(repeats):
        order = executors[r % len(executors):] + executors[:r % len(executors)]
        for e in order:
            runs[e].append(one_run(config, federation, EXECUTORS[e], rounds))
            print(f"  [{name}] sitting {r + 1}/{repeats} {e}: "
                  f"{', '.join(f'{s:.2f}' for s in runs[e][-1]['wall'])} s", flush=True)
    rows = {}
    for e, rs in runs.items():
        wall = [s for run in rs for s in run["wall"]]
        cpu = [s for run in rs for s in run["cpu"]]
        rows[e] = {"first": statistics.median(run["first"] for run in rs),
                   "wall": statistics.median(wall), "wall_mean": statistics.fmean(wall),
                   "cpu": statistics.median(cpu), "rounds": wall,
                   "sittings": [statistics.median(run["wall"]) for run in rs]}
    # Against sequential-2 where it ran, else against the first executor named.
    baseline = BASELINE if BASELINE in rows else next(iter(rows))
    for row in rows.values():
        row["speedup"] = rows[baseline]["wall"] / row["wall"]
    return {"workload": name, "load_before": load_before, "load_after": os.getloadavg()[0],
            "baseline": baseline, "rows": rows}


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['workload']} (load average {result['load_before']:.2f} before, "
          f"{result['load_after']:.2f} after)")
    header = (f"{'executor':<13} {'first s':>8} {'s/round':>8} {'mean':>7} {'CPU s/round':>11} "
              f"{'x vs ' + result['baseline']:>18}  per sitting (median s/round)")
    print(header)
    print("-" * len(header))
    for e, r in result["rows"].items():
        print(f"{e:<13} {r['first']:>8.2f} {r['wall']:>8.3f} {r['wall_mean']:>7.3f} "
              f"{r['cpu']:>11.3f} {r['speedup']:>18.2f}  "
              f"{', '.join(f'{s:.3f}' for s in r['sittings'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--executors", nargs="+", default=list(EXECUTORS), choices=EXECUTORS)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per run")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved sittings")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    root = args.data_dir or default_data_dir()
    try:
        load_dataset("mnist", root)
        real, note = True, f"data: real MNIST from {root}"
    except DataError as err:
        real, note = False, f"data: DIGITS stand-in, not benchmark figures (no MNIST: {err})"
    print("== executors: seconds per round, interleaved ==")
    print(machine())
    print(f"usable cores {len(os.sched_getaffinity(0))}; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', '(unset)')}; {note}")
    print(f"{args.rounds} timed rounds after 1 warm-up, {args.repeats} sittings")
    results = []
    for name in args.workloads:
        config = WORKLOADS[name]
        if config["data"]["dataset"] in ("mnist", "fashion_mnist"):
            config = (cfg.merge(config, {"data": {"root": str(root)}}) if real
                      else on_digits(config))
        federation = build_federation_for(cfg.resolve(config))
        result = measure(name, config, federation, args.executors, args.rounds, args.repeats)
        print_table(result)
        results.append(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": machine(), "real_mnist": real,
                                         "results": results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    if not real:
        print("NOTE: digits stand-in, not benchmark figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
