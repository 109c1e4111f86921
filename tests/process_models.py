"""Models for tests/test_processes.py that misbehave where they train: in a worker process."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn


class _Linear(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        super().__init__()
        size = 1
        for s in input_shape:
            size *= s
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(size, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class FailsInTraining(_Linear):
    """Raises whenever gradients are on (local training); evaluates normally."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            raise RuntimeError("this model refuses to train")
        return super().forward(x)


class InterruptsParent(_Linear):
    """At its first training step in any process, sends SIGINT to `pid` once (the first
    process to create `flag` does); every training step then sleeps, so calls stay in flight."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, pid: int, flag: str) -> None:
        super().__init__(input_shape, n_classes)
        self.pid, self.flag = pid, flag

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL))
                os.kill(self.pid, signal.SIGINT)
            except FileExistsError:
                pass
            time.sleep(0.05)
        return super().forward(x)


class SlowInOneProcess(_Linear):
    """The first process to train claims `flag`; it then sleeps `seconds` at every training
    step and notes the step in `flag`. The other processes train at full speed."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, flag: str,
                 seconds: float) -> None:
        super().__init__(input_shape, n_classes)
        self.flag, self.seconds = flag, seconds
        self.slow: bool | None = None     # decided in each process at its first step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            if self.slow is None:
                try:
                    os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL))
                    self.slow = True
                except FileExistsError:
                    self.slow = False
            if self.slow:
                with open(self.flag, "a") as f:
                    f.write("step\n")
                time.sleep(self.seconds)
        return super().forward(x)
