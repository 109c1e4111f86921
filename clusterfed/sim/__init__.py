"""The in-process runtime: sampling, executors, evaluation, checkpoints, run folders."""

from clusterfed.sim.executor import Executor, SequentialExecutor
from clusterfed.sim.sampling import clients_per_round, sample_clients, task_seed
from clusterfed.sim.simulation import Callback, Simulation, run_config
from clusterfed.sim.vectorised import VectorisedExecutor

__all__ = [
    "Callback",
    "Executor",
    "SequentialExecutor",
    "Simulation",
    "VectorisedExecutor",
    "clients_per_round",
    "run_config",
    "sample_clients",
    "task_seed",
]
