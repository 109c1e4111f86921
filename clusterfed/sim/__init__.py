"""The in-process runtime: sampling, executors, evaluation, checkpoints.

Names load on first use, so importing one module below `clusterfed.sim` (an executor, the
sampling) does not import the simulator and everything it builds on.
"""

from importlib import import_module
from typing import Any

_MODULE_OF = {
    "Callback": "simulation",
    "Executor": "executor",
    "SequentialExecutor": "executor",
    "Simulation": "simulation",
    "VectorisedExecutor": "vectorised",
    "clients_per_round": "sampling",
    "run_config": "simulation",
    "sample_clients": "sampling",
    "task_seed": "sampling",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
