"""The in-process runtime: sampling, executors, evaluation, checkpoints.

Names load on first use, so importing one module below `clusterfed.sim` (an executor) does not
import the simulator and everything it builds on. The sampling and the tasks' seeds live on
the bottom floor (`clusterfed.sampling`), where the clients' runtime reads them too.
"""

from importlib import import_module
from typing import Any

_MODULE_OF = {
    "Callback": "clusterfed.sim.simulation",
    "Executor": "clusterfed.sim.executor",
    "SequentialExecutor": "clusterfed.sim.executor",
    "Simulation": "clusterfed.sim.simulation",
    "VectorisedExecutor": "clusterfed.sim.vectorised",
    "clients_per_round": "clusterfed.sampling",
    "run_config": "clusterfed.sim.simulation",
    "sample_clients": "clusterfed.sampling",
    "task_seed": "clusterfed.sampling",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_MODULE_OF[name]), name)
