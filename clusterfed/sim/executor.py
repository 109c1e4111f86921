"""The Executor protocol, and the sequential executor: the client runtime, in this process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from clusterfed.client.runtime import ClientRuntime
from clusterfed.tasks import ClientResult, ClientTask


class Executor(Protocol):
    """Where client tasks run: this process (sequential, vectorised, worker processes) or
    remote nodes (Flower). `run` answers each task it can with a result carrying the task's
    id; it may answer fewer (a node that never answered), in any order."""

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int = 0
            ) -> list[ClientResult]: ...

    def train_sizes(self) -> np.ndarray: ...

    def test_sizes(self) -> np.ndarray: ...


class SequentialExecutor(ClientRuntime):
    """Runs client tasks in this process, one by one: the client runtime over every client
    (one reusable module, zero-copy data tensors)."""
