"""Client-side work: pure functions of (parameters, local data, task spec).

The task records live in `clusterfed.tasks`, below both the client and the algorithms (no
torch); they are re-exported here. The training functions (`work`) load torch only when first
asked for.
"""

from typing import Any

from clusterfed.tasks import ClientResult, ClientTask, TaskKind, TrainSpec

_WORK = ("evaluate", "gradient", "losses", "run_task", "train")

__all__ = ["ClientResult", "ClientTask", "TaskKind", "TrainSpec", *_WORK]


def __getattr__(name: str) -> Any:
    # PEP 562: `from clusterfed.client import train` still works, importing torch then.
    if name in _WORK:
        from clusterfed.client import work
        return getattr(work, name)
    raise AttributeError(f"module 'clusterfed.client' has no attribute {name!r}")
