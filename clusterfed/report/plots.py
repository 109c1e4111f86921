"""The report's figures, each drawn from the records of a run folder into a PNG."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from clusterfed.clustering.metrics import contingency  # noqa: E402


def _evaluated(metrics: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [m for m in metrics if "mean_accuracy" in m]


def accuracy_curves(metrics: Sequence[Mapping[str, Any]], path: Path,
                    mark: Callable[[Any], None] | None = None) -> None:
    """Mean client accuracy and each true cluster's mean accuracy per round.

    `mark(ax)`, if given, draws a method's own phases on the axes (LCFL's warm-up).
    """
    rows = _evaluated(metrics)
    fig, ax = plt.subplots(figsize=(6, 4))
    rounds = [m["round"] for m in rows]
    for k in sorted(rows[-1]["per_true_cluster_accuracy"], key=int) if rows else []:
        ax.plot(rounds, [m["per_true_cluster_accuracy"].get(k, np.nan) for m in rows],
                lw=1, alpha=0.6, label=f"true cluster {k}")
    ax.plot(rounds, [m["mean_accuracy"] for m in rows], color="black", lw=2, label="mean")
    if mark is not None:
        mark(ax)
    ax.set(xlabel="round", ylabel="client test accuracy", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def per_client_bars(accuracy: Sequence[float], true: Sequence[int], path: Path) -> None:
    """Final accuracy of each client, coloured by its true cluster."""
    fig, ax = plt.subplots(figsize=(max(6, len(accuracy) * 0.15), 3.5))
    colours = plt.get_cmap("tab10")(np.asarray(true) % 10)
    ax.bar(np.arange(len(accuracy)), accuracy, color=colours)
    ax.set(xlabel="client", ylabel="final test accuracy", ylim=(0, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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


def compare_curves(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: Path) -> None:
    """Mean client accuracy per round, one line per algorithm, each its own colour and style."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for (name, metrics), (colour, style) in zip(runs.items(), line_styles(len(runs)),
                                                strict=True):
        rows = _evaluated(metrics)
        ax.plot([m["round"] for m in rows], [m["mean_accuracy"] for m in rows], label=name,
                color=colour, linestyle=style)
    ax.set(xlabel="round", ylabel="mean client test accuracy", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
