"""The task records now live in `clusterfed.tasks` (the bottom floor); imported from here too."""

from clusterfed.tasks import (
    MAML_BATCHES,
    MAML_MOMENTA,
    MAML_VARIANTS,
    ClientResult,
    ClientTask,
    LocalObjective,
    LossSpec,
    SignatureSpec,
    TaskKind,
    TrainSpec,
    match_results,
    numbered,
)

__all__ = ["MAML_BATCHES", "MAML_MOMENTA", "MAML_VARIANTS", "ClientResult", "ClientTask",
           "LocalObjective", "LossSpec", "SignatureSpec", "TaskKind", "TrainSpec",
           "match_results", "numbered"]
