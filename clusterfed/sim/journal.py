"""The step journal: a long step's client results kept on disk in chunks as they come.

A run is checkpointed between rounds, but one step can be hours long: LCFL's exchange at
M clients is M^2 model evaluations in one LOSSES step (about 11 hours of 2 cores at M = 1,200,
docs/reproductions/lcfl.md). A run stopped inside it would start the step over. The journal
runs such a step's tasks in chunks and writes each chunk's results to the run folder's
`journal/` as it finishes; a resumed run that plans the same step again (the same round, step,
clients and models: a fingerprint of them) reads the written chunks back and runs only the
rest. The journal is cleared at each checkpoint, which makes it obsolete, and when a run
starts afresh.

Only LOSSES steps are journalled: each LOSSES task is a pure function of its models and the
client's data, so the results read back equal an unbroken step's, whatever the chunks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed.run_folder import JOURNAL
from clusterfed.state import DamagedState, dumps, loads, save_atomic
from clusterfed.tasks import ClientResult, ClientTask, TaskKind

log = logging.getLogger("clusterfed.journal")

CHUNK = 16               # tasks a chunk: about 15 minutes of one core at M = 1,200
# Model evaluations a step must hold to be journalled: LCFL's exchange at M = 120 (14,400)
# is, IFCA's losses of 4 models at 100 sampled clients (400) are not.
EVALUATIONS = 10_000


def fingerprint(tasks: Sequence[ClientTask], round_index: int, step: int) -> str:
    """What identifies a step's tasks: round, step, each task's id, client and loss spec, and
    the bytes of every distinct model array they carry (LCFL's tasks share one)."""
    h = hashlib.sha256(f"{round_index}/{step}".encode())
    seen: set[int] = set()
    for t in tasks:
        h.update(f"{t.id}:{t.client}:{t.loss!r};".encode())
        if id(t.params) not in seen:
            seen.add(id(t.params))
            h.update(np.ascontiguousarray(t.params).data)
    return h.hexdigest()


def _encoded(result: ClientResult) -> dict[str, Any]:
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    return {**fields, "kind": result.kind.value, "meta": dict(result.meta)}


def _decoded(fields: dict[str, Any]) -> ClientResult:
    return ClientResult(**{**fields, "kind": TaskKind(fields["kind"])})


class StepJournal:
    """A run folder's journal (module docstring)."""

    def __init__(self, run_folder: Path, chunk: int = CHUNK,
                 evaluations: int = EVALUATIONS) -> None:
        self.path = Path(run_folder) / JOURNAL
        self.chunk, self.evaluations = chunk, evaluations

    def takes(self, tasks: Sequence[ClientTask]) -> bool:
        """Whether a step is journalled: LOSSES tasks only, more than one chunk of them, and at
        least `evaluations` model evaluations in all (a task's models are its params' rows)."""
        return (len(tasks) > self.chunk and all(t.kind is TaskKind.LOSSES for t in tasks)
                and sum(len(np.atleast_2d(t.params)) for t in tasks) >= self.evaluations)

    def run(self, tasks: Sequence[ClientTask], round_index: int, step: int,
            execute: Callable[[Sequence[ClientTask]], list[ClientResult]]
            ) -> list[ClientResult]:
        """The step's results, chunk by chunk: read back where the journal holds the chunk
        for these tasks, else `execute`d and written."""
        key = fingerprint(tasks, round_index, step)
        self.path.mkdir(parents=True, exist_ok=True)
        chunks = range(0, len(tasks), self.chunk)
        results: list[ClientResult] = []
        read = 0
        for n, first in enumerate(chunks):
            part = tasks[first:first + self.chunk]
            file = self.path / f"round{round_index + 1}-step{step}-chunk{n:05d}.npz"
            kept = self._read(file, key)
            if kept is None:
                kept = execute(part)
                save_atomic(file, dumps({"key": key, "results": [_encoded(x) for x in kept]}))
                log.info("round %d, step %d: chunk %d of %d done (%d tasks)", round_index + 1,
                         step, n + 1, len(chunks), len(part))
            else:
                read += 1
            results += kept
        if read:
            log.info("round %d, step %d: %d of %d chunks read back from %s", round_index + 1,
                     step, read, len(chunks), self.path)
        return results

    @staticmethod
    def _read(file: Path, key: str) -> list[ClientResult] | None:
        if not file.exists():
            return None
        try:
            payload = loads(file.read_bytes())
        except DamagedState:
            return None
        if payload["key"] != key:     # another step's, or a changed run: not these results
            return None
        return [_decoded(x) for x in payload["results"]]

    def clear(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
