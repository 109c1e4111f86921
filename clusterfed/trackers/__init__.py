"""Experiment trackers (TensorBoard, MLflow, Weights & Biases) beside the run folder."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clusterfed.errors import ConfigError
from clusterfed.trackers.backends import require
from clusterfed.trackers.observer import RunTrackers


def check_trackers(config: Mapping[str, Any], folder: Path | None) -> None:
    """Refuse run.loggers without a run folder or with a tracker's library missing."""
    if folder is None:
        raise ConfigError("run.loggers needs a run folder (the trackers' files and run ids "
                          "live there): give the run an --out")
    for name in config["run"]["loggers"]:
        require(name)


__all__ = ["RunTrackers", "check_trackers"]
