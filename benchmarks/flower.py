"""Seconds per FedAvg round: clusterfed's simulator against Flower's simulation runtime (Ray).

The same task on both, in the same run: MNIST, McMahan et al.'s CNN, 100 iid clients of 600
images, 10 clients per round, 1 local epoch of SGD at batch 10. Flower runs its own
`run_simulation` with a ServerApp (its FedAvg strategy) and a ClientApp (benchmarks/
flower_apps.py), one client at a time per CPU that torch may use here; clusterfed runs
`Simulation` with its default executor (`run.executor=auto`: worker processes, one per core,
on a multi-core CPU). Ray gets as many CPUs as torch has threads (the thread budget of both
sides), one per client, so with 2 cores Flower runs 2 one-CPU actors and clusterfed 2
single-threaded workers. Rounds are timed after one warm-up round (Ray's start, each actor's
data loading and clusterfed's worker start are not counted): wall seconds and CPU seconds of
this process and all its descendants (Ray's raylet and actors, clusterfed's workers), from
/proc. The two sides take turns, A B then B A, `--repeats` times, in one sitting.
Needs `flwr[simulation]==1.42.0`; without it, prints a skip line.

The bound: the round's FLOPs (10 clients' steps, forward and backward), the float32 matmul
peak, and torch's kernel floor: the CPU seconds of the round's training in the textbook loop
(the one Flower's clients run) at one thread, best of 3, divided by the cores. Both sides run
these kernels, so `flower s/round / floor` is the most any implementation on them could gain
over Flower here.

    python benchmarks/flower.py [--rounds N] [--repeats R] [--batch-size B]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import machine, mnist, textbook_epoch
from round_time import matmul_peak_gflops, train_flops_per_image

from clusterfed.data import Federation, build_federation
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.simulation import Simulation

SEED = 0
CLIENTS, PER_CLIENT, PER_ROUND, LR = 100, 600, 10, 0.05
HERE = Path(__file__).resolve().parent
Stamp = tuple[float, float]


def descendants_cpu() -> float:
    """CPU seconds (user + system) of this process and every live descendant, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    mine, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        p = frontier.pop()
        children = [c for c, pp in parent.items() if pp == p and c not in mine]
        mine.update(children)
        frontier += children
    return sum(cpu.get(p, 0.0) for p in mine)


def now() -> Stamp:
    return time.perf_counter(), descendants_cpu()


def iid_federation() -> Federation:
    dataset, _ = mnist()
    return build_federation(dataset, {"kind": "iid", "clients": CLIENTS,
                                      "samples_per_client": PER_CLIENT,
                                      "test_samples_per_client": 1}, SEED)


def round_flops(federation: Federation, batch: int) -> float:
    """FLOPs of one round's training: PER_ROUND clients, one epoch each."""
    c = federation.clients[0]
    x, y = torch.from_numpy(c.train_x[:batch]), torch.from_numpy(c.train_y[:batch])
    model = FlatModel(build_model("fedavg_cnn", federation.input_shape, federation.n_classes))
    return train_flops_per_image(model, x, y) * PER_CLIENT * PER_ROUND


def kernel_floor(federation: Federation, batch: int, repeats: int = 3) -> float:
    """CPU seconds of one round's training (PER_ROUND clients, the textbook loop, plain SGD)
    at one thread, best of `repeats`: torch's kernels with next to nothing around them."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(SEED)
        module = build_model("fedavg_cnn", federation.input_shape, federation.n_classes)
        start = {k: v.clone() for k, v in module.state_dict().items()}
        data = [(torch.from_numpy(c.train_x), torch.from_numpy(c.train_y))
                for c in federation.clients[:PER_ROUND]]

        def one_round() -> None:
            for x, y in data:
                module.load_state_dict(start)
                textbook_epoch(module, torch.optim.SGD(module.parameters(), lr=LR), x, y, batch)

        one_round()   # warm-up
        best = float("inf")
        for _ in range(repeats):
            cpu = time.process_time()
            one_round()
            best = min(best, time.process_time() - cpu)
        return best
    finally:
        torch.set_num_threads(before)


def ours(rounds: int, batch: int) -> list[Stamp]:
    federation = iid_federation()
    stamps = [now()]

    def stamp(completed: int, record: Any) -> bool:
        stamps.append(now())
        return completed == rounds + 1

    config = {"seed": SEED, "data": {"dataset": "mnist"},
              "scenario": {"kind": "iid", "clients": CLIENTS},
              "model": {"name": "fedavg_cnn"},
              "train": {"rounds": rounds + 2, "participation": PER_ROUND, "local_epochs": 1,
                        "batch_size": batch, "lr": LR},
              "algorithm": {"name": "fedavg"}, "eval": {"every": 10**9},
              "run": {"progress": False, "checkpoint_every": 0}}
    Simulation(config, federation=federation, callbacks=[stamp]).run()
    return stamps[1:]   # from the end of the warm-up round


def flower(rounds: int, batch: int) -> list[Stamp]:
    from flwr.app import ArrayRecord, ConfigRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    # Ray's workers import the ClientApp module and benchmarks/common.py from here.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.path.insert(0, str(HERE))
    from flower_apps import app as client_app

    stamps: list[Stamp] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        module = build_model("fedavg_cnn", (1, 28, 28), 10)
        strategy = FedAvg(fraction_train=PER_ROUND / CLIENTS, fraction_evaluate=0.0,
                          min_train_nodes=PER_ROUND, min_available_nodes=CLIENTS)

        def evaluate(server_round: int, arrays: ArrayRecord) -> None:
            stamps.append(now())   # after each round (and before the first)
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
    return stamps[1:]   # stamps[0]: before round 1; round 1 is the warm-up


def per_round(stamps: list[Stamp]) -> tuple[list[float], list[float]]:
    wall = np.diff([s[0] for s in stamps]).tolist()
    cpu = np.diff([s[1] for s in stamps]).tolist()
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (after 1 warm-up)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="sittings: A B, then B A, ... (each starts Ray anew)")
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args(argv)
    print("== FedAvg seconds per round: clusterfed vs Flower simulation (Ray), interleaved ==")
    print(machine())
    print(mnist()[1])
    try:
        import flwr
    except ImportError:
        print("SKIP flower: flwr is not installed (pip install 'flwr[simulation]==1.42.0')")
        return 0
    cpus = torch.get_num_threads()
    print(f"MNIST, fedavg_cnn, {CLIENTS} iid clients x {PER_CLIENT}, {PER_ROUND}/round, "
          f"1 epoch, batch {args.batch_size}; 1 warm-up + {args.rounds} timed rounds each; "
          f"flwr {flwr.__version__}, Ray with {cpus} CPU(s), 1 per client; clusterfed "
          f"run.executor=auto with {cpus} thread(s)")
    sides = {"clusterfed": ours, "flower (ray)": flower}
    walls: dict[str, list[float]] = {s: [] for s in sides}
    cpus_used: dict[str, list[float]] = {s: [] for s in sides}
    load_before = os.getloadavg()[0]
    for r in range(args.repeats):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            wall, cpu = per_round(sides[side](args.rounds, args.batch_size))
            walls[side] += wall
            cpus_used[side] += cpu
            print(f"  sitting {r + 1}/{args.repeats} {side}: "
                  f"{[round(w, 2) for w in wall]} s, CPU {[round(c, 2) for c in cpu]} s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{'runtime':<14} {'s/round':>8} {'mean':>7} {'CPU s/round':>11}")
    for side in sides:
        print(f"{side:<14} {statistics.median(walls[side]):>8.3f} "
              f"{statistics.fmean(walls[side]):>7.3f} {statistics.median(cpus_used[side]):>11.3f}")
    a, b = statistics.median(walls["clusterfed"]), statistics.median(walls["flower (ray)"])
    print(f"flower / clusterfed: {b / a:.2f}x in wall time (medians; issue 18's goal >= 1.5x)")
    federation = iid_federation()
    flops = round_flops(federation, args.batch_size)
    floor = kernel_floor(federation, args.batch_size) / cpus
    peak = matmul_peak_gflops(5)
    print(f"bound: {flops / 1e9:.2f} GFLOP a round; float32 matmul peak {peak:.0f} GFLOP/s "
          f"with {cpus} thread(s) ({flops / peak / 1e9:.3f} s a round); torch's kernel floor "
          f"(textbook loop, 1 thread, best of 3) / {cpus} core(s): {floor:.3f} s a round")
    for side, wall in (("clusterfed", a), ("flower (ray)", b)):
        print(f"  {side}: {wall / floor:.2f}x the floor, {flops / wall / 1e9 / peak:.1%} of the "
              f"matmul peak")
    print(f"the most any implementation on these kernels could gain over Flower here: "
          f"{b / floor:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
