"""Local-training images/s of the vectorised executor against the sequential one.

LCFL's `cnn_femnist_tiny` (417,482 parameters) on MNIST, batch 20, 60 images per client, 2
local epochs (6 steps), all clients of a round from different starting points, as in a
clustered round. Both executors run the same TRAIN tasks in the same process; each is timed
after a warm-up call, best of N. On a GPU: 10, 100 and 1,000 clients per round (the goal is
10x at 1,000). Without CUDA it measures small rounds on the CPU, labelled CPU, and says that
the GPU figures wait for a GPU.

    python benchmarks/vectorised.py [--clients 10 100 1000] [--repeats N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from common import best_of, machine, mnist

from clusterfed.data import build_federation
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.simulation import initial_params
from clusterfed.sim.vectorised import VectorisedExecutor
from clusterfed.tasks import ClientTask, TaskKind, TrainSpec

SEED = 0
PER_CLIENT, BATCH, EPOCHS = 60, 20, 2
GPU_SIZES = (10, 100, 1000)
CPU_SIZES = (10, 50)


def measure(device: torch.device, sizes: tuple[int, ...], repeats: int) -> list[dict]:
    dataset, _ = mnist()
    federation = build_federation(dataset, {"kind": "iid", "clients": max(sizes),
                                            "samples_per_client": PER_CLIENT,
                                            "test_samples_per_client": 1}, SEED)
    module = build_model("cnn_femnist_tiny", federation.input_shape, federation.n_classes)
    initial_params(module, SEED)
    seq = SequentialExecutor(FlatModel(module), federation, SEED, device=device)
    vec = VectorisedExecutor(FlatModel(module), federation, SEED, device=device)
    w0 = seq.model.initial_vector().cpu().numpy()
    rng = np.random.default_rng(SEED)
    spec = TrainSpec(lr=0.05, batch_size=BATCH, epochs=EPOCHS)
    rows = []
    for m in sizes:
        tasks = [ClientTask(c, TaskKind.TRAIN,
                            (w0 + 0.01 * rng.standard_normal(w0.shape)).astype(np.float32), spec)
                 for c in range(m)]
        images = m * PER_CLIENT * EPOCHS
        seq.run(tasks[:2], 0)
        vec.run(tasks, 0)                              # warm-up (and CUDA kernels)
        t_vec = best_of(lambda t=tasks: vec.run(t, 0), repeats)
        t_seq = best_of(lambda t=tasks: seq.run(t, 0), max(1, repeats if m <= 100 else 1))
        rows.append({"clients": m, "sequential": images / t_seq, "vectorised": images / t_vec,
                     "ratio": t_seq / t_vec})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=None,
                        help=f"clients per round (default: {GPU_SIZES} on CUDA, "
                             f"{CPU_SIZES} on CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sizes = tuple(args.clients or (GPU_SIZES if device.type == "cuda" else CPU_SIZES))
    print("== vectorised vs sequential executor: local-training images/s ==")
    print(machine())
    print(mnist()[1])
    print(f"cnn_femnist_tiny, batch {BATCH}, {PER_CLIENT} images/client, {EPOCHS} epochs, "
          f"device {device}, best of {args.repeats}")
    label = "GPU" if device.type == "cuda" else "CPU"
    print(f"{'device':<6} {'clients':>7} {'sequential img/s':>17} {'vectorised img/s':>17} "
          f"{'ratio':>7}")
    for r in measure(device, sizes, args.repeats):
        print(f"{label:<6} {r['clients']:>7} {r['sequential']:>17.1f} {r['vectorised']:>17.1f} "
              f"{r['ratio']:>7.2f}")
    if device.type != "cuda":
        print("WAITING FOR A GPU: no CUDA device here; the GPU figures (10/100/1000 clients, "
              "goal 10x at 1000) need one. These are CPU figures.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
