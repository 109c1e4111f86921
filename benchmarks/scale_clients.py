"""Cost at scale: CFL, FL+HC and IFCA with 1,000 clients, 10 % of them a round (issue 59).

MNIST with the MLP, label permutation into 4 true clusters, log-normal client sizes as the
realistic tier (sigma 1), each method with its defaults. Each method runs in
a fresh process (its peak resident memory its own), sequential executor, one torch thread,
through its clustering step: FL+HC's and IFCA's (k from the data) clustering round, where
every client trains once and the server clusters 1,000 updates, then 2 rounds more; CFL until
every client has reported once (`split_on: latest` then tests all 1,000 members' latest
updates every round), then 2 rounds more. No evaluation inside the rounds.

Printed per method: the median round's seconds, the clustering round's seconds, the server's
seconds (the algorithm's `update`: aggregation and clustering) in the median round and in the
clustering round, and the process's peak resident memory.

    python benchmarks/scale_clients.py [--methods cfl flhc ifca] [--clients 1000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

import numpy as np
from clusterfed.sim.sampling import sample_clients
from common import machine, mnist, peak_rss_mib

from clusterfed.algorithms import RoundContext
from clusterfed.data import build_federation
from clusterfed.sim.simulation import Simulation

SEED, PARTICIPATION, CLUSTERS, AFTER = 0, 0.1, 4, 2
# The realistic tier's log-normal sizes (sigma 1) at 10 samples, not 20, at least: MNIST's
# 10,000 test images give 1,000 clients 10 each, and the floor holds for both splits.
SIZES = {"quantity_skew": {"sigma": 1.0, "min_samples": 10}, "test_samples_per_client": 10}
# FL+HC's rounds_before_clustering and IFCA's select_round (their defaults, 0-based).
CLUSTERING_ROUND = {"flhc": 10, "ifca": 10}


def config(method: str, clients: int, rounds: int) -> dict[str, Any]:
    return {"seed": SEED, "data": {"dataset": "mnist"},
            "scenario": {"kind": "label_permutation", "clients": clients,
                         "clusters": CLUSTERS, **SIZES},
            "model": {"name": "mlp"},
            "train": {"rounds": rounds, "participation": PARTICIPATION},
            "algorithm": {"name": method}, "eval": {"every": 10**9},
            "run": {"progress": False, "checkpoint_every": 0, "executor": "sequential",
                    "device": "cpu", "threads": 1}}


def first_round_all_reported(clients: int) -> int:
    """The (0-based) round by whose end every client has been sampled at least once."""
    seen = np.zeros(clients, dtype=bool)
    r = 0
    while True:
        seen[sample_clients(SEED, r, clients, PARTICIPATION)] = True
        if seen.all():
            return r
        r += 1


class TimedServer:
    """The algorithm, with the wall and CPU seconds of its `update` (the server's work) summed
    per round (CPU seconds: this process's, less disturbed by other jobs on a shared machine)."""

    def __init__(self, algorithm: Any) -> None:
        self._algorithm = algorithm
        self.seconds: dict[int, float] = {}
        self.cpu_seconds: dict[int, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._algorithm, name)

    def update(self, state: Any, ctx: RoundContext, results: Any) -> Any:
        start, cpu = time.perf_counter(), time.process_time()
        out = self._algorithm.update(state, ctx, results)
        r = ctx.round
        self.seconds[r] = self.seconds.get(r, 0.0) + time.perf_counter() - start
        self.cpu_seconds[r] = self.cpu_seconds.get(r, 0.0) + time.process_time() - cpu
        return out


def one_run(method: str, clients: int) -> dict[str, Any]:
    """Build, run through the clustering round and AFTER more, in this (fresh) process."""
    start = time.perf_counter()
    dataset, _ = mnist()
    clustering = CLUSTERING_ROUND.get(method) or first_round_all_reported(clients)
    cfg = config(method, clients, clustering + 1 + AFTER)
    federation = build_federation(dataset, cfg["scenario"], SEED)
    built = time.perf_counter() - start
    stamps, cpu_stamps = [time.perf_counter()], [time.process_time()]

    def stamp(completed: int, record: Any) -> bool:
        stamps.append(time.perf_counter())
        cpu_stamps.append(time.process_time())
        return False

    sim = Simulation(cfg, federation=federation, callbacks=[stamp])
    server = TimedServer(sim.algorithm)
    sim.algorithm = server
    summary = sim.run()
    rounds, cpu_rounds = np.diff(stamps), np.diff(cpu_stamps)
    update = np.array([server.seconds[r] for r in range(len(rounds))])
    cpu_update = np.array([server.cpu_seconds[r] for r in range(len(rounds))])
    return {"method": method, "clients": clients, "build_s": built,
            "clustering_round": clustering + 1, "rounds": len(rounds),
            "round_s": float(np.median(rounds)), "clustering_round_s": float(rounds[clustering]),
            "server_s": float(np.median(update)),
            "server_clustering_s": float(update[clustering]),
            "server_max_s": float(update.max()), "server_max_round": int(update.argmax()) + 1,
            "round_cpu_s": float(np.median(cpu_rounds)),
            "clustering_round_cpu_s": float(cpu_rounds[clustering]),
            "server_cpu_s": float(np.median(cpu_update)),
            "server_clustering_cpu_s": float(cpu_update[clustering]),
            "peak_rss_mib": peak_rss_mib(),
            "clusters": summary["clustering"]["n_clusters"],
            "ari": summary["clustering"].get("ari")}


def child(method: str, clients: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", method, str(clients)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["cfl", "flhc", "ifca"])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_run(args.child[0], int(args.child[1]))))
        return 0
    print(f"== scale: {args.clients} clients, {PARTICIPATION:.0%} a round, MNIST MLP, label "
          f"permutation into {CLUSTERS}, log-normal sizes ==")
    print(machine())
    print(mnist()[1])
    print("seconds as wall / CPU of the process; server: the algorithm's update")
    print(f"{'method':>6} {'rounds':>6} {'clust. round':>12} {'s/round':>12} "
          f"{'clust. round s':>14} {'server s/round':>14} {'server clust. s':>15} "
          f"{'peak MiB':>9} {'clusters':>8} {'ARI':>5}")
    for method in args.methods:
        r = child(method, args.clients)
        ari = "-" if r["ari"] is None else f"{r['ari']:.2f}"
        print(f"{method:>6} {r['rounds']:>6} {r['clustering_round']:>12} "
              f"{r['round_s']:>5.2f} / {r['round_cpu_s']:<5.2f} "
              f"{r['clustering_round_s']:>6.1f} / {r['clustering_round_cpu_s']:<5.1f} "
              f"{r['server_s']:>6.3f} / {r['server_cpu_s']:<5.3f} "
              f"{r['server_clustering_s']:>6.2f} / {r['server_clustering_cpu_s']:<6.2f} "
              f"{r['peak_rss_mib']:>9.0f} {r['clusters']:>8} {ari:>5}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
