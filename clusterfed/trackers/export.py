"""`clusterfed export`: finished run folders into a tracker, through the backends a live run
logs to, so nothing has to be rerun."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.run_folder import read_config, read_jsonl
from clusterfed.trackers.observer import RunTrackers, run_names
from clusterfed.trackers.records import summary_record


def run_folders(folder: Path) -> list[Path]:
    """`folder` if it is a run folder (config.yaml beside metrics.jsonl or summary.json),
    else every run folder under it (a comparison's, a sweep's, a reproduction's seeds)."""
    if is_run(folder):
        return [folder]
    return sorted(p.parent for p in folder.rglob("config.yaml") if is_run(p.parent))


def is_run(folder: Path) -> bool:
    return (folder / "config.yaml").exists() and (
        (folder / "metrics.jsonl").exists() or (folder / "summary.json").exists())


def export(folder: str | Path, to: str, *, logdir: str | Path | None = None,
           experiment: str | None = None) -> list[str]:
    """Log each run folder at or under `folder` as its own run of one experiment (default:
    `folder`'s name); TensorBoard's files go to LOGDIR/RUN (default: each run folder's
    tensorboard/). Returns the runs' names."""
    folder = Path(folder)
    runs = run_folders(folder)
    if not runs:
        raise ConfigError(f"{folder} holds no run folder (config.yaml beside metrics.jsonl or "
                          f"summary.json)")
    experiment = experiment or folder.resolve().name
    names = []
    for run in runs:
        config = cfg.merge(read_config(run), {"run": {"experiment": experiment}})
        _, name = run_names(config, run)
        where = None if logdir is None else Path(logdir) / name
        trackers = RunTrackers.open(config, run, names=[to], logdir=where, keep_state=False)
        assert trackers is not None
        try:
            replay(trackers, run)
        finally:
            trackers.close()
        names.append(name)
    return names


def replay(trackers: RunTrackers, run: Path) -> None:
    """A run folder's records, round by round, then its figures if it finished."""
    events: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for event in read_jsonl(run / "events.jsonl"):
        events[int(event.get("round", 0))].append(event)
    summary = (json.loads((run / "summary.json").read_text())
               if (run / "summary.json").exists() else None)
    metrics = read_jsonl(run / "metrics.jsonl")
    if not metrics and summary is not None:   # a record kept without its rounds
        metrics = [summary_record(summary)]
    for record in metrics:
        trackers.round(record, events.get(int(record["round"]), []))
    if summary is not None:
        trackers.finished(summary, metrics)
