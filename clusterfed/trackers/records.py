"""What a tracker logs, from the records a run writes (metrics.jsonl, events.jsonl, config)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Per-client lists (one series a client) stay in the run folder; trackers get the aggregates.
SKIPPED = frozenset({"round"})


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def round_scalars(record: Mapping[str, Any], assignment: Sequence[int] | None = None
                  ) -> dict[str, float]:
    """A metrics record's figures as flat name -> number: the top-level numbers (accuracy,
    loss, clusters, ARI, NMI, each protocol figure), mappings as `name/key` (per-cluster
    accuracy, separation gaps), and each found cluster's size from `assignment` as
    `cluster_size/k`. None (a score without a truth) and lists (per client) are left out."""
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if _number(value):
            out[prefix] = float(value)
        elif isinstance(value, Mapping):
            for key, inner in value.items():
                walk(f"{prefix}/{key}", inner)

    for key, value in record.items():
        if key not in SKIPPED:
            walk(key, value)
    if assignment is not None:
        for cluster in sorted(set(assignment)):
            out[f"cluster_size/{cluster}"] = float(sum(1 for a in assignment if a == cluster))
    return out


def hyperparameters(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The config as flat dotted keys; numbers, strings and booleans as they are, None and
    lists as text (what the trackers' hyper-parameter tables hold)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(hyperparameters(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = str(value)
    return out


def event_text(event: Mapping[str, Any]) -> str:
    """One event (split, merge, assignment, drift, ...) as a line of text."""
    rest = ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("round", "type"))
    return f"{event.get('type', 'event')}: {rest}" if rest else str(event.get("type", "event"))


def latest_assignment(events: Sequence[Mapping[str, Any]],
                      current: Sequence[int] | None) -> Sequence[int] | None:
    """The clients' assignment after a round's events (the last `assignment` event's)."""
    for event in events:
        if event.get("type") == "assignment":
            current = list(event["assignment"])
    return current


def summary_record(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A finished run's last evaluated round as a metrics record, from its summary alone (the
    reproduction records that keep no metrics.jsonl)."""
    clustering = summary["clustering"]
    return {"round": int(summary["rounds"]), **summary["final"],
            **{k: clustering[k] for k in ("n_clusters", "ari", "nmi") if k in clustering}}
