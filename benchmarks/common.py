"""What the benchmarks share: MNIST (or a synthetic stand-in), the machine, timing helpers."""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from clusterfed.data import Dataset, load_dataset
from clusterfed.errors import DataError

REPO = Path(__file__).resolve().parents[1]


def default_data_dir() -> Path:
    explicit = os.environ.get("CLUSTERFED_SHARED_DATA")
    return Path(explicit) if explicit else REPO.parent / "shared" / "data"


def synthetic_mnist(seed: int = 0) -> Dataset:
    """Random uint8 images and labels of MNIST's shape: the same work per image as MNIST."""
    rng = np.random.default_rng(seed)
    return Dataset(
        "mnist-synthetic",
        rng.integers(0, 256, size=(60000, 1, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, size=60000, dtype=np.int64),
        rng.integers(0, 256, size=(10000, 1, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, size=10000, dtype=np.int64),
        10,
    )


def mnist(root: Path | None = None) -> tuple[Dataset, str]:
    """(MNIST, a line saying where it came from), or synthetic MNIST-shaped data if absent."""
    root = root or default_data_dir()
    try:
        return load_dataset("mnist", root), f"data: real MNIST from {root}"
    except DataError as err:
        return synthetic_mnist(), (f"data: SYNTHETIC random uint8 images of MNIST's shape "
                                   f"(real MNIST not usable: {err})")


def machine() -> str:
    """One line: CPU, threads, accelerator, torch and python versions, load."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"machine: {cpu}, {os.cpu_count()} cores, {gpu}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, python {sys.version.split()[0]}; "
            f"load average {load:.2f}")


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def best_of(fn: Callable[[], object], repeats: int,
            clock: Callable[[], float] = time.perf_counter) -> float:
    """The fastest of `repeats` timed calls, in seconds of `clock` (after the caller's warm-up).

    `time.process_time` (CPU seconds of this process) is disturbed less than wall time by
    other jobs on a shared machine.
    """
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        sync()
        best = min(best, clock() - start)
    return best


def textbook_epoch(module: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                   y: torch.Tensor, batch: int) -> None:
    """One epoch of the textbook PyTorch loop: a fresh permutation, then per batch zero_grad,
    cross-entropy, backward, step (the baseline the benchmarks set clusterfed against)."""
    order = torch.randperm(len(y))
    for start in range(0, len(y), batch):
        idx = order[start:start + batch]
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(module(x[idx]), y[idx]).backward()
        optimizer.step()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
