"""Client-side work: pure functions of (parameters, local data, task spec).

The task records (`tasks`) need no torch, so server code (the algorithms) can import them on
a machine without it; the training functions (`work`) load torch only when first asked for.
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
