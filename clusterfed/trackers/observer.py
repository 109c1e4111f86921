"""The run's observer: each evaluated round's figures, its events, the config and the end's
figures, to every tracker in run.loggers, from the records the run folder gets."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.state import save_atomic
from clusterfed.trackers.backends import BACKENDS, Backend
from clusterfed.trackers.records import (
    event_text,
    hyperparameters,
    latest_assignment,
    round_scalars,
)

# In the run folder: each tracker's run id and the last round logged, to continue them.
STATE = "trackers.json"
DEFAULT_EXPERIMENT = "clusterfed"


def run_names(config: Mapping[str, Any], folder: Path) -> tuple[str, str]:
    """(experiment, run name): run.experiment (default 'clusterfed'), and the run folder's
    path under the experiment's folder (`cfl`, `fedavg/seed-0`), else its own name."""
    experiment = str(config["run"].get("experiment") or DEFAULT_EXPERIMENT)
    parts = folder.resolve().parts
    if experiment in parts[:-1]:
        at = len(parts) - 1 - parts[:-1][::-1].index(experiment)
        return experiment, "/".join(parts[at:])
    return experiment, folder.name


def tensorboard_dir(folder: Path) -> Path:
    return folder / "tensorboard"


class RunTrackers:
    """Logs a run's records to its backends; rounds at or before `logged_round` (already
    logged before a resume) are not logged again, so each step is logged once."""

    def __init__(self, backends: Mapping[str, Backend], state_path: Path | None = None,
                 logged_round: int = 0, assignment: Sequence[int] | None = None) -> None:
        self.backends = dict(backends)
        self.state_path = state_path
        self.logged_round = logged_round
        self.assignment = assignment

    @classmethod
    def open(cls, config: Mapping[str, Any], folder: Path | None, *, resume: bool = False,
             names: Sequence[str] | None = None, logdir: Path | None = None,
             keep_state: bool = True) -> RunTrackers | None:
        """The run's trackers (run.loggers, or `names`), continuing the ones the run folder
        records when resuming; None when there are none."""
        names = list(config["run"].get("loggers") or []) if names is None else list(names)
        if not names:
            return None
        if folder is None:
            raise ConfigError("run.loggers needs a run folder (the trackers' files and run ids "
                              "live there): give the run an --out")
        if not resume and "tensorboard" in names:   # a run started over: its old event files too
            shutil.rmtree(logdir or tensorboard_dir(folder), ignore_errors=True)
        state_path = folder / STATE
        kept = (json.loads(state_path.read_text())
                if resume and keep_state and state_path.exists() else {})
        experiment, name = run_names(config, folder)
        backends: dict[str, Backend] = {}
        try:
            for tracker in names:
                where = (logdir or tensorboard_dir(folder)) if tracker == "tensorboard" \
                    else (logdir or folder)
                backends[tracker] = BACKENDS[tracker](where, experiment, name,
                                                      kept.get(tracker, {}))
        except BaseException:
            for backend in backends.values():
                backend.close(failed=True)
            raise
        trackers = cls(backends, state_path if keep_state else None,
                       int(kept.get("logged_round", 0)), kept.get("assignment"))
        if not kept:
            trackers.started(config)
        return trackers

    def started(self, config: Mapping[str, Any]) -> None:
        params, text = hyperparameters(config), cfg.dump(config)
        for backend in self.backends.values():
            backend.hyperparameters(params, text)
        self._save()

    def round(self, record: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> None:
        """One round's metrics record (all its figures) and events; the clusters' sizes at
        evaluated rounds, beside their accuracies."""
        step = int(record["round"])
        self.assignment = latest_assignment(events, self.assignment)
        if step <= self.logged_round:
            return
        evaluated = "mean_accuracy" in record
        values = round_scalars(record, self.assignment if evaluated else None)
        lines = [event_text(e) for e in events]
        for backend in self.backends.values():
            backend.scalars(step, values)
            backend.texts(step, lines)
            backend.flush()   # before the folder records the round as logged
        self.logged_round = step
        self._save()

    def finished(self, summary: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]
                 ) -> None:
        """The report's figures, as images at the last round."""
        from clusterfed.report.pages import run_figures

        with tempfile.TemporaryDirectory() as tmp:
            paths = run_figures(summary, metrics, Path(tmp))
            for backend in self.backends.values():
                backend.images(int(summary["rounds"]), paths)

    def close(self, failed: bool = False) -> None:
        for backend in self.backends.values():
            backend.close(failed)

    def _save(self) -> None:
        if self.state_path is None:
            return
        state = {"logged_round": self.logged_round, "assignment": self.assignment,
                 **{name: b.state for name, b in self.backends.items()}}
        save_atomic(self.state_path, (json.dumps(state) + "\n").encode())
