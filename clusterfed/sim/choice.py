"""Which device and which executor a run uses (`run.device`, `run.executor`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from clusterfed.client.privacy import ParameterTransform
from clusterfed.data.scenarios import Federation
from clusterfed.errors import ConfigError
from clusterfed.models.flat import FlatModel
from clusterfed.sim.executor import Executor, SequentialExecutor
from clusterfed.sim.vectorised import VectorisedExecutor

log = logging.getLogger("clusterfed")

EXECUTORS = ("auto", "sequential", "vectorised")


def resolve_device(name: str) -> torch.device:
    """'auto' -> CUDA when available, else the CPU; otherwise the named torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"run.device {name!r} is not a torch device (auto, cpu, cuda, "
                          f"cuda:1, ...): {err}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"run.device {name!r}: CUDA is not available here; use cpu or auto")
    return device


def executor_kind(name: str, device: torch.device) -> str:
    """'auto' -> vectorised on CUDA, sequential elsewhere (vectorising was slower on CPUs)."""
    if name not in EXECUTORS:
        raise ConfigError(f"unknown run.executor {name!r}; valid: {', '.join(EXECUTORS)}")
    if name == "auto":
        return "vectorised" if device.type == "cuda" else "sequential"
    return name


def build_executor(run: Mapping[str, Any], model: FlatModel, federation: Federation, seed: int,
                   transform: ParameterTransform | None, validation_fraction: float) -> Executor:
    """The executor the config's `run` section asks for, on its device."""
    device = resolve_device(str(run.get("device", "auto")))
    kind = executor_kind(str(run.get("executor", "auto")), device)
    log.info("executor: %s on %s", kind, device)
    if kind == "vectorised":
        return VectorisedExecutor(model, federation, seed, transform, validation_fraction,
                                  device)
    return SequentialExecutor(model, federation, seed, transform, validation_fraction, device)
