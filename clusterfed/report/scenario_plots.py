"""Figures of a federation's make-up (from `clusterfed.data.describe`), each into a PNG."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

# Beyond this many labels (a text vocabulary) the heatmap shows the most frequent ones only.
MAX_HEATMAP_LABELS = 100


def clients_per_cluster(counts: Mapping[str, int], path: Path) -> None:
    """Bar chart: number of clients in each true cluster."""
    fig, ax = plt.subplots(figsize=(max(4, 0.4 * len(counts) + 2), 3))
    names = list(counts)
    # The same colour per cluster as in the samples-per-client figure.
    colours = plt.get_cmap("tab10")(np.array([int(k) for k in names], dtype=np.int64) % 10)
    ax.bar(range(len(names)), [counts[k] for k in names], color=colours)
    ax.set_xticks(range(len(names)), names)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="true cluster", ylabel="clients")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def samples_per_client(train: Sequence[int], test: Sequence[int],
                       clusters: Sequence[int] | None, path: Path) -> None:
    """Train samples per client (bars, coloured by true cluster; grey without a truth) and test
    samples (dots)."""
    n = len(train)
    fig, ax = plt.subplots(figsize=(max(6, n * 0.12), 3.5))
    colours = ("grey" if clusters is None
               else plt.get_cmap("tab10")(np.asarray(clusters, dtype=np.int64) % 10))
    ax.bar(np.arange(n), train, color=colours, label="train")
    ax.plot(np.arange(n), test, "k.", ms=3, label="test")
    ax.set(xlabel="client", ylabel="samples")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def label_heatmap(histogram: Sequence[Sequence[int]], path: Path, title: str = "") -> None:
    """Clients x labels heatmap of sample counts (rows: clients, columns: labels)."""
    h = np.asarray(histogram, dtype=np.float64)
    if h.ndim != 2 or h.size == 0:
        h = np.zeros((1, 1))
    labels = np.arange(h.shape[1])
    if h.shape[1] > MAX_HEATMAP_LABELS:
        keep = np.sort(np.argsort(-h.sum(axis=0), kind="stable")[:MAX_HEATMAP_LABELS])
        h, labels = h[:, keep], labels[keep]
        title = f"{title} ({MAX_HEATMAP_LABELS} most frequent labels)".strip()
    fig, ax = plt.subplots(figsize=(min(14, max(4, 0.3 * h.shape[1] + 2)),
                                    min(14, max(3, 0.12 * h.shape[0] + 1.5))))
    image = ax.imshow(h, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="samples")
    if len(labels) <= 40:
        ax.set_xticks(range(len(labels)), [str(v) for v in labels], fontsize=7)
    ax.set(xlabel="label", ylabel="client", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_scenario_plots(description: Mapping[str, Any], folder: Path) -> list[Path]:
    """The figures of `describe(...)` into `folder` (no clients-per-cluster chart where the
    true clusters are unknown); returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    per_cluster = folder / "clients_per_cluster.png"
    paths = [folder / "samples_per_client.png", folder / "label_histogram.png"]
    if description["clients_per_cluster"] is not None:
        clients_per_cluster(description["clients_per_cluster"], per_cluster)
        paths.insert(0, per_cluster)
    else:
        per_cluster.unlink(missing_ok=True)   # no stale chart of an earlier description
    samples_per_client(description["train_sizes"], description["test_sizes"],
                       description["true_clusters"], paths[-2])
    label_heatmap(description["train_label_histogram"], paths[-1], "train labels per client")
    return paths
