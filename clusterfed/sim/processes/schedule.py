"""Which worker runs which tasks: each task's expected cost, and the order and chunks in which
the tasks are handed out (guided self-scheduling), or one share a worker (grouped workers)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clusterfed.tasks import ClientTask, TaskKind

# Samples' worth of fixed cost per SGD step (Python, kernel launches): it matters only for
# balancing clients of different sizes, so a rough figure does.
STEP_OVERHEAD = 8


def task_cost(task: ClientTask, train_size: int, test_size: int) -> float:
    """A task's expected cost in samples through the model (a backward pass counts two)."""
    models = task.params.shape[0] if np.ndim(task.params) == 2 else 1
    if task.kind is TaskKind.TRAIN and task.train is not None:
        steps = task.train.num_steps(train_size)
        per_step = 3 * (min(task.train.batch_size, train_size) + STEP_OVERHEAD)
        maml = task.objective.maml if task.objective is not None else None
        return steps * per_step * {None: 1, "fo": 2, "hf": 4}[maml]
    if task.kind is TaskKind.GRADIENT:
        return 3.0 * train_size
    if task.kind is TaskKind.LOSSES:
        n = train_size + (test_size if task.loss is not None and task.loss.data == "train+test"
                          else 0)
        if task.loss is not None and task.loss.max_samples is not None:
            n = min(n, task.loss.max_samples)
        return float(models * n)
    if task.kind is TaskKind.EVALUATE:
        return float(models * test_size)
    return float(train_size)   # SIGNATURE: a decomposition of the client's data


def chunks(costs: Sequence[float], workers: int) -> list[list[int]]:
    """Task indices in the order they are handed out: longest first, in chunks of about half a
    worker's share of the cost still to go (guided self-scheduling; at least one task), each
    chunk in task order.

    Each idle worker takes the next chunk, so a worker slowed by another job on its core gets
    less, and the short tasks at the end even out the finish; a static split would wait for
    the slowest worker. A few dozen messages a call even for thousands of tiny tasks.
    """
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    remaining = float(sum(costs))
    out: list[list[int]] = []
    i = 0
    while i < len(order):
        target = remaining / (2 * workers)
        chunk, size = [order[i]], float(costs[order[i]])
        i += 1
        while i < len(order) and size + costs[order[i]] <= target:
            chunk.append(order[i])
            size += costs[order[i]]
            i += 1
        remaining -= size
        out.append(sorted(chunk))
    return out


def shares(costs: Sequence[float], workers: int) -> list[list[int]]:
    """One share of task indices a worker, of about equal cost (longest first, each to the
    least loaded share), each in task order: what grouped workers take, since a group pays
    only when it is large."""
    load = [0.0] * workers
    out: list[list[int]] = [[] for _ in range(workers)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        w = min(range(workers), key=lambda w: (load[w], w))
        out[w].append(i)
        load[w] += costs[i]
    return [sorted(share) for share in out if share]
