"""The report's figures, each drawn from the records of a run folder into a PNG."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from clusterfed.clustering.metrics import contingency  # noqa: E402


def _evaluated(metrics: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [m for m in metrics if "mean_accuracy" in m]


def grouping(clustering: Mapping[str, Any]) -> tuple[list[int], str]:
    """What a figure groups and colours clients by, and its name: the true clusters where they
    are known, else (own data) the clusters found."""
    true = clustering.get("true_assignment")
    if true is not None:
        return list(true), "true"
    return list(clustering["assignment"]), "found"


# Beyond this many found clusters, their accuracy lines would hide the mean: not drawn.
MAX_CLUSTER_LINES = 10


def cluster_series(rows: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, list[float]]]:
    """Each true cluster's mean accuracy over the evaluated rows; without a truth, each found
    cluster's (NaN in rounds it did not exist). Returns ("true" | "found", {cluster: values})."""
    truth = bool(rows) and rows[-1].get("per_true_cluster_accuracy") is not None
    key = "per_true_cluster_accuracy" if truth else "per_cluster_accuracy"
    ids = sorted({k for m in rows for k in (m.get(key) or {})}, key=int)
    if not truth and len(ids) > MAX_CLUSTER_LINES:
        ids = []
    return ("true" if truth else "found",
            {k: [(m.get(key) or {}).get(k, np.nan) for m in rows] for k in ids})


def accuracy_curves(metrics: Sequence[Mapping[str, Any]], path: Path,
                    mark: Callable[[Any], None] | None = None) -> None:
    """Mean client accuracy and each true (else found) cluster's mean accuracy per round.

    `mark(ax)`, if given, draws a method's own phases on the axes (LCFL's warm-up).
    """
    rows = _evaluated(metrics)
    fig, ax = plt.subplots(figsize=(6, 4))
    rounds = [m["round"] for m in rows]
    what, series = cluster_series(rows)
    for k, values in series.items():
        ax.plot(rounds, values, lw=1, alpha=0.6, label=f"{what} cluster {k}")
    ax.plot(rounds, [m["mean_accuracy"] for m in rows], color="black", lw=2, label="mean")
    if mark is not None:
        mark(ax)
    ax.set(xlabel="round", ylabel="client test accuracy", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def per_client_bars(accuracy: Sequence[float], clusters: Sequence[int], path: Path,
                    what: str = "true") -> None:
    """Final accuracy of each client, coloured by its cluster (`what`: "true", or "found"
    without truth), with a legend of the colours; a client not evaluated (NaN) is marked so,
    not left a blank gap."""
    fig, ax = plt.subplots(figsize=(max(6, len(accuracy) * 0.15), 3.5))
    colours = plt.get_cmap("tab10")(np.asarray(clusters) % 10)
    acc = np.asarray(accuracy, dtype=np.float64)
    ax.bar(np.arange(len(acc)), np.nan_to_num(acc), color=colours)
    for k in np.flatnonzero(np.isnan(acc)):
        ax.text(k, 0.02, "not evaluated", rotation=90, ha="center", va="bottom", fontsize=7)
    ax.set(xlabel="client", ylabel="final test accuracy", ylim=(0, 1))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # clients are whole numbers
    ids = sorted(set(int(c) for c in clusters))
    if len(ids) <= MAX_CLUSTER_LINES:
        ax.legend(handles=[Patch(color=plt.get_cmap("tab10")(k % 10), label=f"{what} {k}")
                           for k in ids], fontsize=8, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def found_clusters(assignment: Sequence[int], accuracy: Sequence[float],
                   max_members: int = 30) -> list[str]:
    """A markdown table of the clusters found: size, mean final accuracy, members."""
    found = np.asarray(assignment)
    acc = np.asarray(accuracy, dtype=np.float64)
    lines = ["| found cluster | clients | mean accuracy | members |", "|---:|---:|---:|---|"]
    for k in np.unique(found):
        members = np.flatnonzero(found == k)
        scored = acc[members][~np.isnan(acc[members])]
        mean = f"{scored.mean():.4f}" if len(scored) else "n/a"
        if len(scored) < len(members):
            mean += f" ({len(scored)} of {len(members)} evaluated)"
        shown = ", ".join(str(int(c)) for c in members[:max_members])
        if len(members) > max_members:
            shown += f", ... (+{len(members) - max_members})"
        lines.append(f"| {int(k)} | {len(members)} | {mean} | {shown} |")
    return lines


def cluster_matrix(true: Sequence[int], found: Sequence[int], path: Path) -> None:
    """Clients per (true cluster, found cluster)."""
    table, true_ids, found_ids = contingency(np.asarray(true), np.asarray(found))
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * len(found_ids) + 2), 0.35 * len(true_ids) + 2))
    ax.imshow(table, cmap="Blues", aspect="auto", vmin=0)
    if table.size <= 400:
        for (i, j), v in np.ndenumerate(table):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(found_ids)), [str(f) for f in found_ids], fontsize=7)
    ax.set_yticks(range(len(true_ids)), [str(t) for t in true_ids])
    ax.set(xlabel="found cluster", ylabel="true cluster")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# Line styles beyond tab10's ten colours: the first ten lines solid, the next ten dashed, ...
LINE_STYLES = ("-", "--", ":", "-.")


def line_styles(count: int) -> list[tuple[tuple[float, ...], str]]:
    """(colour, line style) for `count` lines, no two alike: tab10's colours, then the next
    style. Raises if there are more lines than pairs."""
    colours = plt.get_cmap("tab10").colors
    if count > len(colours) * len(LINE_STYLES):
        raise ValueError(f"at most {len(colours) * len(LINE_STYLES)} distinguishable lines")
    return [(tuple(colours[i % len(colours)]), LINE_STYLES[i // len(colours)])
            for i in range(count)]


# The comparison's panels: methods without clusters by what they do instead; every other
# method clusters. FedAvg, the reference, is drawn in every panel.
REFERENCE = "fedavg"
KINDS = {"personalised": ("local", "lg_fedavg", "per_fedavg", "fedavg_ft"),
         "drift-correcting": ("fedprox", "fednova", "scaffold")}


def method_panels(algorithms: Mapping[str, str]) -> dict[str, list[str]]:
    """Run labels by panel ("clustered", "personalised", "drift-correcting"), from each
    label's algorithm; empty panels left out, and a lone FedAvg gets the clustered one."""
    panels: dict[str, list[str]] = {"clustered": [], **{kind: [] for kind in KINDS}}
    for label, algorithm in algorithms.items():
        if algorithm != REFERENCE:
            kind = next((k for k, names in KINDS.items() if algorithm in names), "clustered")
            panels[kind].append(label)
    shown = {kind: labels for kind, labels in panels.items() if labels}
    return shown or {"clustered": []}


def compare_curves(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: Path,
                   algorithms: Mapping[str, str] | None = None) -> None:
    """Mean client accuracy per round, one panel per kind of method (`method_panels`), one
    line per run, each its own colour and style, FedAvg in every panel, legends beside."""
    algorithms = algorithms or {name: name for name in runs}
    panels = method_panels(algorithms)
    reference = [label for label, a in algorithms.items() if a == REFERENCE and label in runs]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3.2 * len(panels)), sharex=True,
                             squeeze=False)
    for ax, (kind, labels) in zip(axes[:, 0], panels.items(), strict=True):
        for label in reference:
            rows = _evaluated(runs[label])
            ax.plot([m["round"] for m in rows], [m["mean_accuracy"] for m in rows],
                    color="black", lw=2, label=label)
        for label, (colour, style) in zip(labels, line_styles(len(labels)), strict=True):
            rows = _evaluated(runs[label])
            ax.plot([m["round"] for m in rows], [m["mean_accuracy"] for m in rows],
                    label=label, color=colour, linestyle=style)
        ax.set(ylabel="mean client\ntest accuracy", ylim=(0, 1), title=f"{kind} methods")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1, 0].set_xlabel("round")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
