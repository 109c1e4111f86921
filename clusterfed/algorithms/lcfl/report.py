"""LCFL's figures and the report's "LCFL" section, drawn from a run folder's records.

The records: events.jsonl's "lcfl_clustering" event (its round, the found labels, the logged
clients' rows of d, the exchange's cost), metrics.jsonl's accuracy per evaluated round, and
summary.json's true assignment. Rounds are the simulator's (1-based). Without a truth (own
data) d is ordered by the clusters found and no ARI is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from clusterfed.clustering.metrics import clustering_scores  # noqa: E402
from clusterfed.report import plots  # noqa: E402
from clusterfed.run_folder import read_jsonl  # noqa: E402

Record = Mapping[str, Any]
IMAGES = {"distance": "lcfl_distance.png", "accuracy": "lcfl_accuracy.png"}


def clustering_event(events: Sequence[Record]) -> Record | None:
    found = [e for e in events if e.get("type") == "lcfl_clustering"]
    return found[-1] if found else None


def true_order(true: Sequence[int], found: Sequence[int]) -> np.ndarray:
    """Positions sorted by true cluster, then found cluster, then position."""
    return np.lexsort((np.arange(len(true)), np.asarray(found), np.asarray(true)))


def distance_plot(event: Record, true: Sequence[int] | None, path: Path) -> None:
    """d with the logged clients ordered by true cluster; lines mark the true blocks. Without a
    truth (None), ordered by found cluster, lines marking the found blocks."""
    clients = np.asarray(event["distance_clients"], dtype=np.int64)
    d = np.asarray(event["distance"], dtype=np.float64)
    found = np.asarray(event["labels"])[clients]
    labels = found if true is None else np.asarray(true)[clients]
    what = "found" if true is None else "true"
    order = true_order(labels, found)
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    image = ax.imshow(d[np.ix_(order, order)], cmap="viridis", interpolation="nearest")
    edges = np.flatnonzero(np.diff(labels[order])) + 0.5
    for e in edges:
        ax.axhline(e, color="white", lw=0.8)
        ax.axvline(e, color="white", lw=0.8)
    ax.set(title=f"LCFL d ({event.get('metric', 'loss')}), clients by {what} cluster",
           xlabel="client (ordered)", ylabel="client (ordered)")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def accuracy_plot(metrics: Sequence[Record], clustering_round: int | None, path: Path) -> None:
    """Mean and per-cluster accuracy; the warm-up shaded up to the clustering round."""

    def warm_up(ax: Any) -> None:
        if clustering_round is not None:
            ax.axvspan(0, clustering_round, color="grey", alpha=0.2, label="warm-up")
            ax.axvline(clustering_round, color="grey", ls="--", lw=1)

    plots.accuracy_curves(metrics, path, mark=warm_up)


def run_section(folder: Path, summary: Record, metrics: Sequence[Record]) -> list[str]:
    """The report lines of the LCFL section; writes its PNGs into `folder`."""
    events = read_jsonl(folder / "events.jsonl") if (folder / "events.jsonl").exists() else []
    event = clustering_event(events)
    true = summary["clustering"]["true_assignment"]
    lines = ["## LCFL", ""]
    if event is None:
        accuracy_plot(metrics, None, folder / IMAGES["accuracy"])
        return lines + ["The run ended before the clustering round (still in the warm-up).",
                        "", f"![accuracy]({IMAGES['accuracy']})", ""]
    scored = ""
    if true is not None:
        ari = clustering_scores(np.asarray(true), np.asarray(event["labels"]))["ari"]
        scored = f", ARI {ari:.3f} against the true clusters"
    distance_plot(event, true, folder / IMAGES["distance"])
    accuracy_plot(metrics, int(event["round"]), folder / IMAGES["accuracy"])
    shown = len(event["distance_clients"])
    lines += [
        f"- clustered once, in round {event['round']}, on the {event.get('metric', 'loss')} "
        f"dissimilarity: {event['clusters']} clusters{scored}, silhouette on d "
        f"{event.get('silhouette', float('nan')):.3f}",
        f"- exchange cost: {event['model_evaluations']:,} model evaluations, "
        f"{event['bytes_down_per_client'] / 1e6:.2f} MB down and "
        f"{event['bytes_up_per_client'] / 1e6:.4f} MB up per client; client compute "
        f"{event['client_seconds_total']:.1f} s in all, {event['client_seconds_max']:.2f} s "
        f"for the slowest client",
        "",
        f"### d, clients ordered by {'found' if true is None else 'true'} cluster ({shown} "
        f"of {len(summary['clustering']['assignment'])} clients)", "",
        f"![distance]({IMAGES['distance']})", "",
        "### Accuracy per round, the warm-up shaded", "",
        f"![accuracy]({IMAGES['accuracy']})", "",
    ]
    return lines
