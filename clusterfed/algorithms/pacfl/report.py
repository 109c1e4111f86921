"""PACFL's figures and the report's "PACFL" section, drawn from a run folder's records.

The records: events.jsonl's "pacfl_clustering" event (the clients in matrix order, the
proximity matrix A in degrees, scipy's linkage tree, beta, the flat labels) and any
"pacfl_newcomers" events (the extended A and the rerun), metrics.jsonl's accuracies, and
summary.json's true assignment (without one, own data: figures grouped by the clusters found).
Also the paper's efficiency measures (Tables 4, 8, 9): rounds to a target accuracy and the
communication they cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.cluster.hierarchy import dendrogram  # noqa: E402

from clusterfed.algorithms.newcomers import newcomer_figures, newcomer_ids  # noqa: E402
from clusterfed.algorithms.pacfl import principal_angles as pa  # noqa: E402
from clusterfed.report import plots  # noqa: E402
from clusterfed.run_folder import read_config, read_jsonl  # noqa: E402

Record = Mapping[str, Any]
IMAGES = {"proximity": "pacfl_proximity.png", "dendrogram": "pacfl_dendrogram.png",
          "beta": "pacfl_beta.png"}
# Models each participant moves per round, in the paper's cost tables (spec 4.8): one down and
# one up; IFCA and SCAFFOLD three; a local-only client none.
TRANSFERS = {"local": 0, "ifca": 3, "scaffold": 3}
TARGETS = (0.5, 0.75, 0.8, 0.9, 0.95)


def clustering_events(events: Sequence[Record]) -> list[Record]:
    return [e for e in events if e.get("type") in ("pacfl_clustering", "pacfl_newcomers")]


def true_order(true: Sequence[int], found: Sequence[int]) -> np.ndarray:
    """Positions sorted by true cluster, then found cluster, then position."""
    true, found = np.asarray(true), np.asarray(found)
    return np.lexsort((np.arange(len(true)), found, true))


def cut_height(event: Record) -> float:
    """Where the dendrogram is cut: beta, or between the merges an n_clusters cut keeps apart."""
    tree = np.asarray(event["tree"], dtype=np.float64)
    z = len(set(event["labels"]))
    beta = event.get("beta")
    if len(tree) == 0:
        return float(beta or 0.0)
    if beta is not None and "n_clusters" in event and event["n_clusters"] is None:
        return float(beta)
    heights = np.sort(tree[:, 2])
    done = len(heights) - (z - 1)        # merges performed
    below = heights[done - 1] if done > 0 else 0.0
    above = heights[done] if done < len(heights) else heights[-1] * 1.05 + 1e-9
    if beta is not None and "n_clusters" not in event and below <= beta < above:
        return float(beta)   # an older record: a beta cut
    return pa.cut_threshold(tree, z)


def angle_gap(proximity: np.ndarray, true: np.ndarray) -> tuple[float, float] | None:
    """(largest angle inside a true cluster, smallest angle across): HC at a beta between the
    two recovers the true clusters with any linkage. None with a single true cluster."""
    same = true[:, None] == true[None]
    off = ~np.eye(len(true), dtype=bool)
    if (~same).sum() == 0:
        return None
    inside = proximity[same & off]
    return (float(inside.max()) if len(inside) else 0.0, float(proximity[~same].min()))


def plot_proximity(event: Record, true: Sequence[int] | None, path: Path) -> None:
    """A in degrees, clients ordered by true cluster (None: by found cluster), blocks lined."""
    ids = np.asarray(event["clients"])
    a = np.asarray(event["proximity"], dtype=np.float64)
    found = np.asarray(event.get("assignment", event["labels"]))
    t = found if true is None else np.asarray(true)[ids]
    order = true_order(t, found)
    fig, ax = plt.subplots(figsize=(6.2, 5.2))
    im = ax.imshow(a[np.ix_(order, order)], cmap="viridis_r", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="angle (degrees)")
    for k in np.flatnonzero(np.diff(t[order]) != 0):
        ax.axhline(k + 0.5, color="white", lw=0.8)
        ax.axvline(k + 0.5, color="white", lw=0.8)
    ax.set_title(f"proximity matrix A ({event['measure']}), clients by "
                 f"{'found' if true is None else 'true'} cluster")
    ax.set_xlabel("client (ordered)")
    ax.set_ylabel("client (ordered)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_dendrogram(event: Record, true: Sequence[int], path: Path, what: str = "true"
                    ) -> None:
    """The signatures' dendrogram and its cut; dots: each leaf's true (or `what`) cluster."""
    tree = np.asarray(event["tree"], dtype=np.float64)
    ids = np.asarray(event["clients"])
    fig, ax = plt.subplots(figsize=(9, 4))
    if len(tree):
        colours = plt.get_cmap("tab10")
        out = dendrogram(tree, ax=ax, no_labels=len(ids) > 60, color_threshold=0,
                         above_threshold_color="#555555",
                         labels=[str(c) for c in ids.tolist()])
        # Leaves coloured by true cluster along the bottom.
        leaves = np.asarray(out["leaves"])
        xs = 5 + 10 * np.arange(len(leaves))
        ax.scatter(xs, np.zeros(len(xs)), c=[colours(int(true[ids[i]]) % 10) for i in leaves],
                   s=12, zorder=3, clip_on=False)
        ax.axhline(cut_height(event), color="crimson", ls="--",
                   label=f"cut: {len(set(event['labels']))} clusters")
        ax.legend(loc="upper right")
    ax.set_ylabel(f"{event['linkage']} linkage distance (degrees)")
    ax.set_title(f"dendrogram of the clients' signatures (dots: {what} cluster)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_clusters_against_beta(event: Record, path: Path) -> None:
    tree = np.asarray(event["tree"], dtype=np.float64)
    n = len(event["clients"])
    top = float(tree[:, 2].max()) * 1.1 if len(tree) else 1.0
    betas = np.linspace(0.0, top, 200)
    counts = pa.clusters_against_beta(tree, n, betas)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.step(betas, counts, where="post")
    ax.axvline(cut_height(event), color="crimson", ls="--", label="this run's cut")
    ax.set_yscale("log")
    ax.set_xlabel("beta (degrees)")
    ax.set_ylabel("clusters")
    ax.set_title("number of clusters against beta (Figs. 2, 6)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# Efficiency (Tables 4, 8, 9) ---------------------------------------------------------------


def rounds_to_target(metrics: Sequence[Record], target: float,
                     key: str = "mean_accuracy") -> int | None:
    """The first (1-based) evaluated round whose accuracy reaches `target`; None if none does."""
    for m in metrics:
        if key in m and m[key] >= target:
            return int(m["round"])
    return None


def paper_cost_mb(rounds: int, participation: float, transfers: int, params: int) -> float:
    """The paper's cost to target (spec 4.8): rounds x R x M x 32 bits x params / 1e6,
    truncated to 2 decimals; the signatures' one-shot upload is not counted."""
    return math.floor(rounds * participation * transfers * 32 * params / 1e6 * 100) / 100


def model_size(metrics: Sequence[Record]) -> int | None:
    """Parameters per model, from PACFL's per-round traffic record."""
    for m in metrics:
        p = m.get("pacfl", {})
        moved = p.get("clients_trained", 0) + p.get("finetuned", 0)
        if moved:
            return int(p["down_floats"] // moved)
    return None


def targets_table(runs: Mapping[str, Sequence[Record]], participation: float,
                  params: int | None, targets: Sequence[float] = TARGETS) -> list[str]:
    """Markdown: rounds to each target (and the paper's Mb) per algorithm."""
    head = "| algorithm | " + " | ".join(f"{t:.0%}" for t in targets) + " |"
    lines = [head, "|" + "---|" * (len(targets) + 1)]
    for name, metrics in runs.items():
        cells = []
        for t in targets:
            r = rounds_to_target(metrics, t)
            if r is None:
                cells.append("-")
            elif params is None:
                cells.append(str(r))
            else:
                mb = paper_cost_mb(r, participation, TRANSFERS.get(name, 2), params)
                cells.append(f"{r} ({mb:.2f} Mb)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


# The report section ---------------------------------------------------------------------------


def run_section(folder: Path, summary: Record, metrics: Sequence[Record]) -> list[str]:
    """A run report's "PACFL" section."""
    config = read_config(folder) if (folder / "config.yaml").exists() else {}
    events = read_jsonl(folder / "events.jsonl") if (folder / "events.jsonl").exists() else []
    found = clustering_events(events)
    lines = ["## PACFL", ""]
    if not found:
        return lines + ["No clustering was recorded.", ""]
    known = summary["clustering"]["true_assignment"]
    groups, what = plots.grouping(summary["clustering"])
    last = [e for e in found if "tree" in e][-1]   # the newest HC (nearest joins run none)
    plot_proximity(last, known, folder / IMAGES["proximity"])
    plot_dendrogram(last, groups, folder / IMAGES["dendrogram"], what)
    plot_clusters_against_beta(last, folder / IMAGES["beta"])
    z = len(set(last["labels"]))
    lines += [f"- signatures clustered at round {found[0]['round']}: {z} clusters, "
              f"{last['linkage']} linkage, measure {last['measure']}, "
              f"cut at {cut_height(last):.2f} degrees ("
              + (f"n_clusters {last['n_clusters']})" if last.get("n_clusters") is not None
                 else f"beta {last['beta']})" if last.get("beta") is not None
                 else "the best silhouette)")]
    gap = None if known is None else angle_gap(np.asarray(last["proximity"]),
                                               np.asarray(known)[np.asarray(last["clients"])])
    if gap is not None:
        lines.append(f"- largest angle inside a true cluster {gap[0]:.2f} degrees, smallest "
                     f"across {gap[1]:.2f}: " + ("separable by a threshold" if gap[0] < gap[1]
                                                 else "no threshold separates them"))
    final = summary["final"]
    if "cluster_mean_accuracy" in final:
        lines.append(f"- mean accuracy, each client's own model after its last local training "
                     f"(the paper's protocol): {final['mean_accuracy']:.4f}; each client's "
                     f"cluster model: {final['cluster_mean_accuracy']:.4f}")
    ids = newcomer_ids(config)
    if ids:   # computed again: summaries from before `final.newcomers` lack it
        news = newcomer_figures(final, ids)
        text = f"- newcomers ({len(ids)}): mean accuracy {news['mean_accuracy']:.4f}"
        if "cluster_mean_accuracy" in news:
            text += f" (cluster models {news['cluster_mean_accuracy']:.4f})"
        joins = [e for e in found if e["type"] == "pacfl_newcomers"]
        if joins and joins[-1].get("rule", "rerun") == "nearest":
            n_old = len(joins[-1]["clients"]) - len(joins[-1]["newcomers"])
            started = len(set(joins[-1]["assignment"][n_old:]) - set(
                joins[-1]["assignment"][:n_old]))
            lines.append(text + f"; each joined the cluster at the least mean angle within "
                         f"{joins[-1]['threshold']:.2f} degrees, else a new one "
                         f"({started} new)")
        else:
            moved = [e.get("old_moved", 0) for e in joins]
            keep = not config.get("algorithm", {}).get("reassign_existing", False)
            lines.append(text + f"; old clients the rerun put in another cluster: {sum(moved)}"
                         + (" (kept in their own)" if keep else " (moved)"))
    participation = float(config.get("train", {}).get("participation", 0.1))
    lines += ["", "### Rounds to target (Table 4) and the paper's cost to reach it "
              "(Tables 8, 9)", ""]
    lines += targets_table({"pacfl": metrics}, participation, model_size(metrics))
    lines += ["", f"### Proximity matrix (clients ordered by {what} cluster)", "",
              f"![proximity]({IMAGES['proximity']})", "",
              "### Dendrogram and its cut", "", f"![dendrogram]({IMAGES['dendrogram']})", "",
              "### Clusters against beta", "", f"![beta]({IMAGES['beta']})", ""]
    return lines


def comparison_section(folder: Path, runs: Mapping[str, Sequence[Record]]) -> list[str]:
    """A comparison report's rounds to target and their cost, for every run."""
    if not (folder / "config.yaml").exists():
        return []
    participation = float(read_config(folder)["train"]["participation"])
    return ["## Rounds to target and the paper's cost (PACFL Tables 4, 8, 9)", "",
            *targets_table(runs, participation, model_size(runs["pacfl"])), ""]
