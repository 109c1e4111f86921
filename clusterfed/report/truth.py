"""Scoring a run afterwards: `clusterfed report RUN --truth FILE`.

A run on own data knows no true clusters, so its records hold no ARI (null). Whoever knows the
truth (an exported scenario's `truth.json`) can score the run later: FILE is JSON with the key
`true_clusters`, one whole number per client. The run's records stay as the runtime wrote them;
the report is drawn from copies rescored as if the run had known the truth. Per round, the
clustering is the one in force then: events.jsonl logs each change of the assignment.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed.clustering.metrics import truth_figures
from clusterfed.errors import ConfigError, DataError

Record = Mapping[str, Any]
KEY = "true_clusters"


def read_truth(path: str | Path) -> np.ndarray:
    """The true clusters in a truth file, one whole number >= 0 per client."""
    path = Path(path)
    try:
        content = json.loads(path.read_text())
    except OSError as err:
        raise DataError(f"cannot read the truth file {path}: {err}") from err
    except json.JSONDecodeError as err:
        raise DataError(f"truth file {path} is not JSON: {err}") from err
    values = content.get(KEY) if isinstance(content, Mapping) else None
    if not isinstance(values, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise DataError(f"truth file {path} needs {{\"{KEY}\": [...]}}: a list of whole "
                        f"numbers >= 0, one per client")
    return np.asarray(values, dtype=np.int64)


def check_length(truth: np.ndarray, clients: int, source: str) -> None:
    if len(truth) != clients:
        raise ConfigError(f"truth file {source} gives {len(truth)} clients; the run has "
                          f"{clients}: it is the truth of another federation")


def assignment_changes(events: Sequence[Record]) -> list[tuple[int, np.ndarray]]:
    """(round, assignment) of every change of the assignment the simulator logged, in order."""
    return [(int(e["round"]), np.asarray(e["assignment"], dtype=np.int64))
            for e in events if e.get("type") == "assignment"]


def assignment_at(changes: Sequence[tuple[int, np.ndarray]], rnd: int) -> np.ndarray | None:
    """The assignment in force after round `rnd`; None if none was logged by then."""
    held = [a for r, a in changes if r <= rnd]
    return held[-1] if held else None


def rescored(summary: Record, metrics: Sequence[Record], events: Sequence[Record],
             truth: np.ndarray, source: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Copies of the summary and the metrics records scored against `truth`.

    Each evaluated record gets ARI, NMI and per-true-cluster accuracy of the assignment in force
    at its round; a record whose round precedes every logged assignment is left as it was.
    """
    found = np.asarray(summary["clustering"]["assignment"], dtype=np.int64)
    check_length(truth, len(found), source)
    out = copy.deepcopy(dict(summary))
    final = truth_figures(np.asarray(out["final"]["per_client_accuracy"], dtype=np.float64),
                          found, truth)
    out["final"]["per_true_cluster_accuracy"] = final["per_true_cluster_accuracy"]
    out["clustering"].update(true_assignment=truth.tolist(), ari=final["ari"], nmi=final["nmi"],
                             truth_file=source)
    changes = assignment_changes(events)
    records = []
    for m in metrics:
        record = copy.deepcopy(dict(m))
        at = assignment_at(changes, int(m.get("round", 0)))
        if "per_client_accuracy" in m and at is not None and len(at) == len(truth):
            record.update(truth_figures(np.asarray(m["per_client_accuracy"], dtype=np.float64),
                                        at, truth))
        records.append(record)
    return out, records


def score_rows(metrics: Sequence[Record]) -> list[str]:
    """A markdown table: clusters, ARI and NMI of every evaluated round that has them."""
    lines = ["| round | clusters | ARI | NMI |", "|---:|---:|---:|---:|"]
    for m in metrics:
        if m.get("ari") is not None:
            lines.append(f"| {m['round']} | {m['n_clusters']} | {m['ari']:.3f} | "
                         f"{m['nmi']:.3f} |")
    return lines
