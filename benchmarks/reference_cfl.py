"""Seconds per round of the CFL reference workload: the authors' own code against clusterfed.

The workload (Sattler et al.'s setting at small scale): MNIST with label swap, 20 clients in 4
true clusters, 400 training and 100 test images a client, the 5,142-parameter ConvNet
(`cfl_convnet`), SGD lr 0.1 momentum 0.9 (lr x 0.99 a round), batch 128, 1 local epoch, every
client every round, evaluation of every client after every round, 30 rounds, the split test of
the authors' notebook (eps1 0.4, eps2 1.6, only after round 20; complete linkage).

Sides, on the same data, in one process, with the same thread budget (`--threads`, default
torch's, i.e. the usable cores):

- `authors`: github.com/felisat/clustered-federated-learning, read from `--authors PATH` (or
  $CLUSTERFED_CFL_AUTHORS) and run unchanged: `fl_devices.py`'s Client and Server and the loop
  of their notebook (`compute_weight_update`, `reset`, `compute_pairwise_similarities`, the
  norms, `cluster_clients`, `aggregate_clusterwise`, `evaluate`). Only `fl_devices.py` is
  imported (`helper.py` needs IPython and matplotlib for the notebook's plots, which are not
  timed; the notebook's data come through torchvision, which is not installed here): each
  Client gets a TensorDataset of its 500 images (their `train_frac` 0.8 splits them 400/100),
  which is cheaper than the notebook's torchvision transforms per image. Their `models.py`
  ConvNet is the 3-channel CIFAR variant (16*5*5 into the linear layer); on 1x28x28 MNIST the
  same layers are `cfl_convnet`, which both sides use (checked layer by layer below). With a
  scikit-learn that no longer takes `affinity`, `cluster_clients` gets AgglomerativeClustering
  with `metric` in its place (their module's name is rebound; the file is not changed).
- `clusterfed-auto`: `Simulation` with `run.executor=auto` (worker processes on a multi-core
  CPU), `run.threads` = the budget; `clusterfed-sequential`: the sequential executor;
  `clusterfed-grouped`: the grouped executor (clients as one wider model; float-tolerance equal);
  `clusterfed-grouped-workers`: the grouped executor in one single-threaded worker process per
  thread of the budget (`run.executor=grouped`, `run.workers`), each training its share.
  CFL with the same split rule (acceptance fixed with gamma_max 0, i.e. every split the norms
  allow, complete linkage, no split before round 21).
- `bare`: a textbook PyTorch loop over the same tensors and the same steps (load the cluster
  model, SGD with momentum, the update, per-cluster averages, one cosine-similarity matmul, a
  no-grad evaluation): no federated-learning code at all, a floor for the framework overhead.

Rounds are timed one by one (wall, and CPU seconds of this process plus its worker processes,
from /proc). Each run is `--rounds` rounds; its first round (which starts the workers for
`processes`) is shown apart, and `s/round` is the median of the others. The sides take turns
(A B C D, then D C B A, ...) `--repeats` times. The FLOPs of a round are counted with
torch.utils.flop_counter (training steps forward and backward, the evaluation forward) and set
against the machine's float32 matmul peak measured in the same run with the same threads.
Two floors bound what torch's kernels allow: the bare loop's round at one thread (the
kernels per client) and the same steps and evaluation with the clients grouped as the grouped
executor groups them, each in CPU seconds, divided by the cores.

    python benchmarks/reference_cfl.py --authors PATH [--rounds 30] [--repeats 2]
        [--threads N] [--sides ...] [--data-dir DIR] [--json PATH]

Without the authors' code it prints a SKIP line and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from common import default_data_dir, machine, textbook_epoch
from executors import cpu_seconds
from torch.utils.flop_counter import FlopCounterMode

from clusterfed import config as cfg
from clusterfed.data import Federation, load_dataset
from clusterfed.errors import DataError
from clusterfed.models import MODELS, FlatModel, build_model
from clusterfed.models.grouped import GroupedModel
from clusterfed.sim.grouped import group_size, widest_activation
from clusterfed.sim.simulation import Simulation, build_federation_for

SEED = 0
CLIENTS, CLUSTERS, TRAIN, TEST = 20, 4, 400, 100
BATCH, LR, MOMENTUM, DECAY = 128, 0.1, 0.9, 0.99
EPS_1, EPS_2, NO_SPLIT_BEFORE = 0.4, 1.6, 20   # the notebook's; its test is c_round > 20
SIDES = ("authors", "clusterfed-auto", "clusterfed-sequential", "clusterfed-grouped",
         "clusterfed-grouped-workers", "bare")
FILES = ("fl_devices.py",)

Clock = Callable[[], tuple[float, float]]


def workload_config(root: Path | None, rounds: int, executor: str, threads: int
                    ) -> dict[str, Any]:
    data: dict[str, Any] = {"dataset": "mnist"}
    if root is not None:
        data["root"] = str(root)
    return {"seed": SEED, "data": data,
            "scenario": {"kind": "label_swap", "clients": CLIENTS, "clusters": CLUSTERS,
                         "samples_per_client": TRAIN, "test_samples_per_client": TEST},
            "model": {"name": "cfl_convnet"},
            "train": {"rounds": rounds, "participation": 1.0, "local_epochs": 1,
                      "batch_size": BATCH, "lr": LR, "momentum": MOMENTUM, "lr_decay": DECAY},
            "algorithm": {"name": "cfl", "eps1": EPS_1, "eps2": EPS_2, "acceptance": "fixed",
                          "gamma_max": 0.0, "bipartition": "complete",
                          "warmup_rounds": NO_SPLIT_BEFORE, "weighting": "uniform"},
            "eval": {"protocol": "cluster", "every": 1},
            "run": {"executor": executor.removesuffix("-workers"), "threads": threads,
                    "workers": threads if executor.endswith("-workers") else None,
                    "progress": False, "checkpoint_every": 0}}


def model_fn(federation: Federation) -> Callable[[], torch.nn.Module]:
    return lambda: build_model("cfl_convnet", federation.input_shape, federation.n_classes)


def authors_model_fn(federation: Federation) -> Callable[[], torch.nn.Module]:
    """cfl_convnet in their models.py's order, pool(relu(conv)): the registered factory
    without build_model's exact ReLU-after-pool rewrite, which their code does not make."""
    factory = MODELS.get("cfl_convnet")
    return lambda: factory(input_shape=federation.input_shape, n_classes=federation.n_classes)


# --- the authors' side -------------------------------------------------------------------------


def load_authors(path: Path) -> ModuleType:
    """Their fl_devices.py as a module, from its file (unchanged)."""
    spec = importlib.util.spec_from_file_location("cfl_authors_fl_devices", path / FILES[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    agglomerative = module.AgglomerativeClustering
    if "affinity" not in inspect.signature(agglomerative).parameters:
        # scikit-learn >= 1.4 renamed `affinity` to `metric`.
        def renamed(affinity: str = "euclidean", **kwargs: Any) -> Any:
            return agglomerative(metric=affinity, **kwargs)
        module.AgglomerativeClustering = renamed
    return module


def check_convnet(path: Path, federation: Federation) -> str:
    """Their models.py ConvNet against cfl_convnet: the same layers but the input channels and
    the linear layer's width (their file is the CIFAR variant)."""
    spec = importlib.util.spec_from_file_location("cfl_authors_models", path / "models.py")
    if not (path / "models.py").exists() or spec is None or spec.loader is None:
        return "models.py not found: not compared"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    theirs = module.ConvNet()
    ours = model_fn(federation)()

    def layers(m: torch.nn.Module) -> list[str]:
        # Convolutions and linear layers; both compute pool(relu(conv)) twice (read, not traced).
        return [f"conv{x.kernel_size}->{x.out_channels}" if isinstance(x, torch.nn.Conv2d)
                else f"linear->{x.out_features}" for x in m.modules()
                if isinstance(x, torch.nn.Conv2d | torch.nn.Linear)]

    count = sum(p.numel() for p in ours.parameters())
    same = layers(theirs) == layers(ours)
    return (f"their ConvNet: {sum(p.numel() for p in theirs.parameters())} parameters "
            f"({theirs.conv1.in_channels} input channels, {theirs.fc1.in_features} into the "
            f"linear layer); cfl_convnet: {count} (1 channel, 256); layers otherwise "
            f"{'identical' if same else 'DIFFERENT'}: {layers(ours)}")


def run_authors(fl: ModuleType, federation: Federation, rounds: int, clock: Clock
                ) -> dict[str, Any]:
    """The notebook's CFL loop over their Client and Server, timed round by round."""
    torch.manual_seed(SEED)   # their random_split and the models' initialisation
    make = authors_model_fn(federation)
    clients = []
    for i, c in enumerate(federation.clients):
        data = torch.utils.data.TensorDataset(
            torch.from_numpy(np.concatenate([c.train_x, c.test_x])),
            torch.from_numpy(np.concatenate([c.train_y, c.test_y])))
        clients.append(fl.Client(make, lambda x: torch.optim.SGD(x, lr=LR, momentum=MOMENTUM),
                                 data, idnum=i))
    test = federation.clients[0]
    server = fl.Server(make, torch.utils.data.TensorDataset(torch.from_numpy(test.test_x),
                                                            torch.from_numpy(test.test_y)))
    cluster_indices = [np.arange(len(clients)).astype("int")]
    stamps = [clock()]
    acc_clients: list[float] = []
    for c_round in range(1, rounds + 1):
        if c_round == 1:
            for client in clients:
                client.synchronize_with_server(server)
        participating_clients = server.select_clients(clients, frac=1.0)
        for client in participating_clients:
            client.compute_weight_update(epochs=1)
            client.reset()
        similarities = server.compute_pairwise_similarities(clients)
        cluster_indices_new = []
        for idc in cluster_indices:
            max_norm = server.compute_max_update_norm([clients[i] for i in idc])
            mean_norm = server.compute_mean_update_norm([clients[i] for i in idc])
            if (mean_norm < EPS_1 and max_norm > EPS_2 and len(idc) > 2
                    and c_round > NO_SPLIT_BEFORE):
                server.cache_model(idc, clients[idc[0]].W, acc_clients)
                c1, c2 = server.cluster_clients(similarities[idc][:, idc])
                cluster_indices_new += [c1, c2]
            else:
                cluster_indices_new += [idc]
        cluster_indices = cluster_indices_new
        client_clusters = [[clients[i] for i in idcs] for idcs in cluster_indices]
        server.aggregate_clusterwise(client_clusters)
        acc_clients = [client.evaluate() for client in clients]
        stamps.append(clock())
    return {"stamps": stamps, "clusters": len(cluster_indices),
            "accuracy": float(np.mean(acc_clients))}


# --- clusterfed -------------------------------------------------------------------------------


def run_clusterfed(config: dict[str, Any], federation: Federation, clock_of: Callable[
                   [Simulation], Clock]) -> dict[str, Any]:
    sim = Simulation(config, federation=federation)
    clock = clock_of(sim)
    stamps = [clock()]
    accuracy: list[float] = []

    def stamp(completed: int, record: Any) -> bool:
        stamps.append(clock())
        accuracy.append(record.get("mean_accuracy", float("nan")))
        return False

    sim.callbacks.append(stamp)
    sim.run()
    clusters = sim.algorithm.clusters(sim.state).num_clusters
    return {"stamps": stamps, "clusters": clusters, "accuracy": accuracy[-1],
            "executor": type(sim.executor).__name__}


# --- the bare loop ----------------------------------------------------------------------------


def run_bare(federation: Federation, rounds: int, clock: Clock) -> dict[str, Any]:
    """Plain PyTorch: one module, SGD with momentum, per-cluster means, no clustering logic
    beyond the similarity matmul (the split rule's cost is negligible)."""
    torch.manual_seed(SEED)
    module = model_fn(federation)()
    params = list(module.parameters())
    data = [(torch.from_numpy(c.train_x), torch.from_numpy(c.train_y),
             torch.from_numpy(c.test_x), torch.from_numpy(c.test_y)) for c in federation.clients]
    w = torch.nn.utils.parameters_to_vector(params).detach().clone()
    models = w[None].repeat(CLUSTERS, 1)
    member = [i * CLUSTERS // len(data) for i in range(len(data))]  # 4 clusters from the start
    stamps = [clock()]
    correct = 0
    for r in range(rounds):
        updates = torch.empty(len(data), w.numel())
        for i, (x, y, _, _) in enumerate(data):
            start = models[member[i]]
            torch.nn.utils.vector_to_parameters(start, params)
            textbook_epoch(module, torch.optim.SGD(params, lr=LR * DECAY ** r,
                                                   momentum=MOMENTUM), x, y, BATCH)
            with torch.no_grad():
                updates[i] = torch.nn.utils.parameters_to_vector(params) - start
        unit = updates / updates.norm(dim=1, keepdim=True).clamp_min(1e-12)
        _similarities = unit @ unit.T
        for k in range(CLUSTERS):
            rows = [i for i in range(len(data)) if member[i] == k]
            models[k] += updates[rows].mean(0)
        correct = 0
        with torch.no_grad():
            for i, (_, _, xt, yt) in enumerate(data):
                torch.nn.utils.vector_to_parameters(models[member[i]], params)
                correct += int((module(xt).argmax(1) == yt).sum())
        stamps.append(clock())
    return {"stamps": stamps, "clusters": CLUSTERS,
            "accuracy": correct / sum(len(d[3]) for d in data)}


# --- FLOPs and the peak -----------------------------------------------------------------------


def round_flops(federation: Federation) -> tuple[float, float]:
    """(training, evaluation) FLOPs of one round: every client's steps and test forward."""
    module = model_fn(federation)()
    c = federation.clients[0]
    x, y = torch.from_numpy(c.train_x), torch.from_numpy(c.train_y)
    with FlopCounterMode(display=False) as counter:
        for b in range(math.ceil(len(y) / BATCH)):
            F.cross_entropy(module(x[b * BATCH:(b + 1) * BATCH]),
                            y[b * BATCH:(b + 1) * BATCH]).backward()
    train = float(counter.get_total_flops())
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(torch.from_numpy(c.test_x))
    return train * CLIENTS, float(counter.get_total_flops()) * CLIENTS


def matmul_peak(repeats: int = 10) -> float:
    """float32 GFLOP/s of a 2048x2048 matmul, best of `repeats` after two warm-up calls."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(2):
        a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * 2048**3 / best / 1e9


def kernel_floor(federation: Federation, repeats: int = 3) -> float:
    """CPU seconds of one round of the bare loop at one thread, best of `repeats` (its second
    round): torch's kernels for the round's steps and evaluation with next to nothing around
    them. Divided by the cores, a floor for any implementation on these kernels."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(repeats):
            stamps = run_bare(federation, 2, clock_for(list))["stamps"]
            best = min(best, stamps[2][1] - stamps[1][1])
        return best
    finally:
        torch.set_num_threads(before)


def grouped_kernel_floor(federation: Federation, repeats: int = 3) -> float:
    """CPU seconds of one round's kernels at one thread with the clients grouped (the
    grouped executor's arrangement: K clients a call, one grouped convolution and one batched
    matmul per layer), best of `repeats`: each group's SGD-with-momentum steps and its test
    forward, with nothing else around them. Torch's kernels in either arrangement known here
    take at least min(this, `kernel_floor`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(SEED)
        module = model_fn(federation)()
        grouped = GroupedModel(module)
        start = FlatModel(module).initial_vector()
        k = group_size(widest_activation(grouped, federation.input_shape), BATCH)
        clients = federation.clients
        xs = torch.stack([torch.from_numpy(c.train_x) for c in clients])
        ys = torch.stack([torch.from_numpy(c.train_y) for c in clients])
        xt = torch.stack([torch.from_numpy(c.test_x) for c in clients])
        steps = math.ceil(TRAIN / BATCH)
        best = float("inf")
        for _ in range(repeats):
            began = time.process_time()
            for g in range(0, len(clients), k):
                members = slice(g, min(g + k, len(clients)))
                w = grouped.pack(start[None].repeat(members.stop - g, 1))
                velocity = [torch.zeros_like(t) for t in w]
                order = torch.randperm(TRAIN)
                for s in range(steps):
                    rows = order[s * BATCH:(s + 1) * BATCH]
                    leaves = [t.detach().requires_grad_(True) for t in w]
                    logits = grouped(leaves, xs[members][:, rows])
                    loss = F.cross_entropy(logits.flatten(0, 1), ys[members][:, rows].flatten())
                    grads = torch.autograd.grad(loss, leaves)
                    with torch.no_grad():
                        for t, v, grad in zip(w, velocity, grads, strict=True):
                            v.mul_(MOMENTUM).add_(grad)
                            t.sub_(LR * v)
                with torch.no_grad():
                    grouped(w, xt[members]).argmax(-1)
            best = min(best, time.process_time() - began)
        return best
    finally:
        torch.set_num_threads(before)


def _floor_beside_others(federation: Federation, barrier: Any) -> float:
    barrier.wait()          # every process starts its rounds together
    return grouped_kernel_floor(federation)


def grouped_floor_together(federation: Federation, cores: int) -> float:
    """The grouped floor (CPU s of a round at one thread) while `cores` processes run it at
    once, the mean over them: what a core's kernels cost when the other cores work too, with
    whatever they share (the L3 cache, memory bandwidth, a physical core under two virtual
    ones). Over the cores, a floor for splitting the round among them."""
    context = mp.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(cores)
        with ProcessPoolExecutor(cores, mp_context=context) as pool:
            runs = [pool.submit(_floor_beside_others, federation, barrier)
                    for _ in range(cores)]
            return statistics.mean(run.result() for run in runs)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# --- the sitting ------------------------------------------------------------------------------


def clock_for(pids: Callable[[], list[int]]) -> Clock:
    return lambda: (time.perf_counter(), time.process_time() + cpu_seconds(pids()))


def one_run(side: str, fl: ModuleType | None, federation: Federation, root: Path | None,
            rounds: int, threads: int) -> dict[str, Any]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if side == "authors":
            assert fl is not None
            out = run_authors(fl, federation, rounds, clock_for(list))
        elif side == "bare":
            out = run_bare(federation, rounds, clock_for(list))
        else:
            executor = side.split("-", 1)[1]
            out = run_clusterfed(workload_config(root, rounds, executor, threads), federation,
                                 lambda sim: clock_for(
                                     lambda: getattr(sim.executor, "started_pids", [])))
    finally:
        torch.set_num_threads(before)
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    walls, cpus, firsts, totals = [], [], [], []
    for run in runs:
        w = np.diff([s[0] for s in run["stamps"]])
        c = np.diff([s[1] for s in run["stamps"]])
        firsts.append(float(w[0]))
        totals.append(float(w.sum()))
        walls += w[1:].tolist()
        cpus += c[1:].tolist()
    return {"first": statistics.median(firsts), "wall": statistics.median(walls),
            "wall_mean": statistics.fmean(walls), "cpu": statistics.median(cpus),
            "total": statistics.median(totals), "clusters": [r["clusters"] for r in runs],
            "accuracy": [round(float(r["accuracy"]), 4) for r in runs],
            "executor": runs[0].get("executor", ""), "rounds": walls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors", type=Path,
                        default=os.environ.get("CLUSTERFED_CFL_AUTHORS") or None,
                        help="folder with the authors' fl_devices.py (and models.py)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved sittings")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="the thread budget of every side (default: torch's)")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    print("== CFL reference workload: the authors' code vs clusterfed, interleaved ==")
    fl = None
    if "authors" in args.sides:
        if args.authors is None or not (args.authors / FILES[0]).exists():
            print("SKIP reference_cfl: the authors' code was not given (--authors PATH or "
                  "$CLUSTERFED_CFL_AUTHORS: a folder holding fl_devices.py of "
                  "github.com/felisat/clustered-federated-learning)")
            return 0
        fl = load_authors(args.authors)
    env = os.environ.get("CLUSTERFED_DATA")
    root = args.data_dir or (Path(env) if env else default_data_dir())
    try:
        load_dataset("mnist", root)
    except DataError as err:
        print(f"SKIP reference_cfl: MNIST is needed ({err})")
        return 0
    federation = build_federation_for(cfg.resolve(workload_config(root, 1, "sequential", 1)))
    print(machine())
    print(f"usable cores {len(os.sched_getaffinity(0))}; thread budget {args.threads} for every "
          f"side; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
    print(f"MNIST label swap, {CLIENTS} clients x {TRAIN} train + {TEST} test, {CLUSTERS} true "
          f"clusters, cfl_convnet, batch {BATCH}, 1 epoch, {args.rounds} rounds, evaluation "
          f"every round; {args.repeats} interleaved sittings")
    if args.authors is not None and fl is not None:
        print(check_convnet(args.authors, federation))
    train_flops, eval_flops = round_flops(federation)
    floor = kernel_floor(federation)
    grouped_floor = grouped_kernel_floor(federation)
    cores = min(args.threads, len(os.sched_getaffinity(0)))
    together = grouped_floor_together(federation, cores) if cores > 1 else grouped_floor
    torch.set_num_threads(args.threads)
    peak = matmul_peak()
    flops = train_flops + eval_flops
    print(f"FLOPs a round: {flops / 1e9:.2f} G ({train_flops / 1e9:.2f} training, "
          f"{eval_flops / 1e9:.2f} evaluation); matmul peak {peak:.1f} GFLOP/s at "
          f"{args.threads} thread(s): bound {flops / peak / 1e9 * 1e3:.1f} ms a round")
    print(f"torch's kernels alone (the bare loop's round at 1 thread, CPU s, best of 3): "
          f"{floor:.3f} s, {flops / floor / 1e9:.1f} GFLOP/s; over {cores} core(s): a floor of "
          f"{floor / cores:.3f} s a round on these kernels")
    print(f"torch's kernels with the clients grouped (1 thread, CPU s, best of 3): "
          f"{grouped_floor:.3f} s, {flops / grouped_floor / 1e9:.1f} GFLOP/s; over {cores} "
          f"core(s): {grouped_floor / cores:.3f} s a round")
    if cores > 1:
        print(f"the same with {cores} processes running it at once (CPU s each, mean): "
              f"{together:.3f} s, {together / grouped_floor:.2f}x alone; over {cores} cores: "
              f"{together / cores:.3f} s a round")
    lower = min(floor, grouped_floor)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.sides}
    load_before = os.getloadavg()[0]
    for r in range(args.repeats):
        order = list(args.sides) if r % 2 == 0 else list(reversed(args.sides))
        for side in order:
            out = one_run(side, fl, federation, root, args.rounds, args.threads)
            runs[side].append(out)
            w = np.diff([s[0] for s in out["stamps"]])
            print(f"  sitting {r + 1}/{args.repeats} {side}: first {w[0]:.2f} s, median "
                  f"{float(np.median(w[1:])):.3f} s/round, total {w.sum():.1f} s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    rows = {s: summarise(rs) for s, rs in runs.items()}
    base = rows.get("authors")
    print(f"\nload average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    if base:
        print(f"the most any implementation on torch's kernels (per client or grouped) could "
              f"gain over the authors here: {base['wall'] / (lower / cores):.2f}x (their "
              f"s/round / the lower floor over {cores} core(s))")
        if cores > 1:
            print(f"with the cores working at once (the grouped floor measured in {cores} "
                  f"processes together): {base['wall'] / (together / cores):.2f}x")
    header = (f"{'side':<22} {'first s':>7} {'s/round':>8} {'mean':>7} {'CPU s/rnd':>9} "
              f"{'total s':>8} {'x authors':>9} {'of peak':>7}  clusters  accuracy")
    print(header)
    print("-" * len(header))
    for s, row in rows.items():
        row["speedup"] = base["wall"] / row["wall"] if base else float("nan")
        row["of_peak"] = flops / row["wall"] / (peak * 1e9)
        print(f"{s:<22} {row['first']:>7.2f} {row['wall']:>8.3f} {row['wall_mean']:>7.3f} "
              f"{row['cpu']:>9.3f} {row['total']:>8.1f} {row['speedup']:>9.2f} "
              f"{row['of_peak']:>7.1%}  {row['clusters']}  {row['accuracy']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(), "threads": args.threads, "flops": flops,
            "train_flops": train_flops, "eval_flops": eval_flops, "peak_gflops": peak,
            "kernel_floor_cpu_s": floor, "grouped_kernel_floor_cpu_s": grouped_floor,
            "grouped_floor_together_cpu_s": together,
            "cores": cores,
            "load_before": load_before, "load_after": os.getloadavg()[0], "rows": rows},
            indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
