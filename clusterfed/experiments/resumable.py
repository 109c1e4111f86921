"""One run folder's run, whatever state a cut-off command left it in.

A finished run (summary.json) is read back, a cut-off one resumes from its checkpoint, a new
one runs: `reproduce`, `sweep` and FL+HC's pairings can be rerun until done, losing at most
the rounds since the last checkpoint. A folder holding another config is refused, not reused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.experiments.parallel import (
    WORKER_FEDERATION,
    LatestFederation,
    check_jobs,
    in_processes,
)
from clusterfed.run_folder import checkpoint_files, read_config

# What makes two runs the same run. `eval` is left out: a reproduction may evaluate less often
# than the finished run it reads back (its final figures are the same round's).
IDENTITY = ("seed", "data", "scenario", "model", "train", "algorithm", "newcomers")
# Where a table sets runs' per-round figures side by side (compare, sweep), evaluation counts.
IDENTITY_WITH_EVAL = (*IDENTITY, "eval")


def same_data(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The data section up to where the files are read from."""
    return {k: v for k, v in a.items() if k != "root"} == {
        k: v for k, v in b.items() if k != "root"}


def check_folder(config: Mapping[str, Any], folder: Path,
                 identity: Sequence[str] = IDENTITY) -> None:
    """Refuse a folder that holds a run of another config."""
    if (folder / "config.yaml").exists():
        held = read_config(folder)
        differs = [k for k in identity if held.get(k) != config.get(k)
                   and not (k == "data" and same_data(held[k], config[k]))]
        if differs:
            raise ConfigError(f"{folder} holds a run of another config ({', '.join(differs)} "
                              f"differ): choose another --out")


# The simulator, imported when a run starts: torch takes seconds, and the commands check their
# arguments first.
def run_config(config: Mapping[str, Any], folder: Path, **kwargs: Any) -> dict[str, Any]:
    from clusterfed.sim.simulation import run_config as run

    return run(config, folder, **kwargs)


def resume_run(folder: Path, **kwargs: Any) -> dict[str, Any]:
    from clusterfed.sim.simulation import resume_run as resume

    return resume(folder, **kwargs)


def run_or_resume(config: Mapping[str, Any], folder: Path, federation: Any,
                  data_dir: str | None, identity: Sequence[str] = IDENTITY) -> dict[str, Any]:
    """A finished run's summary, a cut-off one resumed, or a new run."""
    check_folder(config, folder, identity)
    if (folder / "summary.json").exists():
        return json.loads((folder / "summary.json").read_text())
    if checkpoint_files(folder):
        return resume_run(folder, data_dir=data_dir)
    return run_config(config, folder, federation=federation)


@dataclass(frozen=True)
class Job:
    """One run of a reproduction, sweep or comparison: its config, its folder, what makes a
    finished run in that folder the same run."""
    config: dict[str, Any]
    folder: Path
    identity: tuple[str, ...] = IDENTITY


def threads_per_job(config: Mapping[str, Any], jobs: int) -> dict[str, Any]:
    """The config with run.threads set to the job's share of the cores when it sets none:
    two runs that each take every core run several times slower side by side."""
    from clusterfed.sim.processes import usable_cores

    if jobs <= 1 or config["run"]["threads"]:
        return dict(config)
    return cfg.merge(dict(config), {"run": {"threads": max(1, usable_cores() // jobs)}})


def run_jobs(jobs: Sequence[Job], data_dir: str | None, *, workers: int = 1,
             started: Callable[[int], None] | None = None,
             finished: Callable[[int, dict[str, Any]], None] | None = None,
             federations: LatestFederation | None = None) -> list[dict[str, Any]]:
    """Every job's summary, in order; `workers` runs at a time in their own processes.

    A finished run is read back without starting it. `started(i)` is called as job i starts,
    `finished(i, summary)` as it ends. One worker runs the jobs here, consecutive jobs on one
    (data, scenario, seed) sharing its federation (`federations`, if given, may already hold
    one); several each build their own, as deterministic as this one. Every folder is checked
    before any run starts; a run that fails in a worker ends the command once the runs beside
    it have finished (none is cut short)."""
    check_jobs(workers)
    jobs = one_experiment(jobs)
    for job in jobs:
        check_folder(job.config, job.folder, job.identity)
    summaries: list[dict[str, Any] | None] = [None] * len(jobs)
    to_run = []
    for i, job in enumerate(jobs):
        if (job.folder / "summary.json").exists():
            summaries[i] = run_or_resume(job.config, job.folder, None, data_dir, job.identity)
            if finished is not None:
                finished(i, summaries[i])
        else:
            to_run.append(i)
    if workers == 1 or len(to_run) <= 1:
        federations = federations or LatestFederation()
        for i in to_run:
            if started is not None:
                started(i)
            summaries[i] = _run_job(jobs[i], data_dir, federations)
            if finished is not None:
                finished(i, summaries[i])
    else:
        done = in_processes(_worker_job, [(jobs[i], data_dir) for i in to_run], workers,
                            started=None if started is None else lambda k: started(to_run[k]),
                            finished=None if finished is None
                            else lambda k, summary: finished(to_run[k], summary))
        for i, summary in zip(to_run, done, strict=True):
            summaries[i] = summary
    return [s for s in summaries if s is not None]


def one_experiment(jobs: Sequence[Job]) -> list[Job]:
    """The jobs with run.experiment, where unset, the name of the folder holding them all:
    the trackers (run.loggers) log a comparison's, sweep's or reproduction's runs as one
    experiment."""
    if not jobs:
        return []
    root = Path(os.path.commonpath([job.folder.resolve() for job in jobs]))
    if len(jobs) == 1:
        root = root.parent
    return [replace(job, config=cfg.merge(job.config, {"run": {"experiment": root.name}}))
            if job.config["run"]["loggers"] and not job.config["run"]["experiment"] else job
            for job in jobs]


def _run_job(job: Job, data_dir: str | None, federations: LatestFederation) -> dict[str, Any]:
    # A cut-off run resumes from its folder, which builds its own federation.
    federation = (None if (job.folder / "checkpoint.npz").exists()
                  else federations.get(job.config, data_dir))
    return run_or_resume(job.config, job.folder, federation, data_dir, job.identity)


def _worker_job(job: Job, data_dir: str | None) -> dict[str, Any]:
    return _run_job(job, data_dir, WORKER_FEDERATION)
