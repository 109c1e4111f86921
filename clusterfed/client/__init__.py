"""Client-side work: pure functions of (parameters, local data, task spec)."""

from clusterfed.client.tasks import ClientResult, ClientTask, TaskKind, TrainSpec
from clusterfed.client.work import evaluate, gradient, losses, run_task, train

__all__ = [
    "ClientResult",
    "ClientTask",
    "TaskKind",
    "TrainSpec",
    "evaluate",
    "gradient",
    "losses",
    "run_task",
    "train",
]
