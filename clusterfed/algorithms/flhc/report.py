"""FL+HC's figures and the report's "FL+HC" sections, drawn from a run folder's records.

The records: events.jsonl's "hierarchical_clustering" event (round, the scipy linkage matrix
"tree" over the clustering round's clients, the cut height, the labels, cluster sizes),
metrics.jsonl's per-round mean accuracy and clients_at_target (with eval.target_accuracy),
and summary.json's true assignment (else, for own data, the clusters found). Rounds are the
simulator's (1-based): the clustering round is the first part of round n+1, whose evaluation
is the paper's "post-cluster" figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.cluster import hierarchy  # noqa: E402

from clusterfed.report import plots  # noqa: E402
from clusterfed.run_folder import read_jsonl  # noqa: E402

Record = Mapping[str, Any]
IMAGES = {"dendrogram": "flhc_dendrogram.png", "curves": "flhc_curves.png",
          "compare": "flhc_vs_fedavg.png"}


def clustering_event(events: Sequence[Record]) -> Record | None:
    return next((e for e in events if e.get("type") == "hierarchical_clustering"), None)


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def dendrogram_plot(event: Record, true_assignment: Sequence[int], path: Path,
                    what: str = "true") -> None:
    """The clustering round's dendrogram, the cut as a dashed line, leaves by true cluster
    (`what` "found": `true_assignment` holds the clusters found, no truth being known)."""
    tree = np.asarray(event["tree"], dtype=np.float64)
    clients = np.asarray(event["clients"])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.09 * len(clients)), 4))
    if len(tree):
        cut = event.get("cut_height")
        info = hierarchy.dendrogram(tree, ax=ax, no_labels=True, color_threshold=cut or 0,
                                    above_threshold_color="#888888")
        true = np.asarray(true_assignment)[clients[info["leaves"]]]
        xs = 5 + 10 * np.arange(len(true))
        ax.scatter(xs, np.zeros(len(xs)), c=[plt.get_cmap("tab10")(int(k) % 10) for k in true],
                   marker="s", s=12, clip_on=False, zorder=3)
        if cut is not None:
            ax.axhline(cut, ls="--", color="red", lw=1,
                       label=f"cut at {cut:.3g}: {event['n_clusters']} clusters")
            ax.legend(fontsize=8)
            ax.set_ylim(top=max(ax.get_ylim()[1], 1.05 * cut))
    ax.set(title=f"FL+HC clustering round ({event['metric']}, {event['linkage']} linkage); "
                 f"squares: {what} cluster", xlabel="clients", ylabel="merge height")
    _save(fig, path)


def clustering_round(metrics: Sequence[Record]) -> int | None:
    """The 1-based round that began with the clustering round."""
    return next((int(m["round"]) for m in metrics if "flhc_clustering" in m), None)


def curves_plot(runs: Mapping[str, Sequence[Record]], marked: int | None, path: Path) -> None:
    """Mean client accuracy and % clients at target per round, the clustering round marked."""
    has_target = any("clients_at_target" in m for rows in runs.values() for m in rows)
    fig, axes = plt.subplots(1, 2 if has_target else 1, figsize=(11 if has_target else 6, 4),
                             squeeze=False)
    for name, rows in runs.items():
        rows = [m for m in rows if "mean_accuracy" in m]
        rounds = [m["round"] for m in rows]
        axes[0, 0].plot(rounds, [m["mean_accuracy"] for m in rows], label=name)
        if has_target:
            axes[0, 1].plot(rounds, [100 * m.get("clients_at_target", np.nan) for m in rows],
                            label=name)
    axes[0, 0].set(xlabel="round", ylabel="mean client test accuracy")
    if has_target:
        axes[0, 1].set(xlabel="round", ylabel="% clients at target accuracy")
    for ax in axes[0]:
        if marked is not None:
            ax.axvline(marked - 0.5, color="black", lw=1)   # between round n and round n+1
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def first_evaluated(metrics: Sequence[Record], rnd: int | None) -> int | None:
    """The first evaluated round at or after `rnd` (with eval.every > 1 the clustering round
    itself may not be evaluated), or None."""
    if rnd is None:
        return None
    return min((int(m["round"]) for m in metrics
                if "mean_accuracy" in m and int(m["round"]) >= rnd), default=None)


def figures(metrics: Sequence[Record], rnd: int | None) -> dict[str, float | None]:
    row = next((m for m in metrics if m.get("round") == rnd and "mean_accuracy" in m), None)
    if row is None:
        return {"mean_accuracy": None, "clients_at_target": None}
    return {"mean_accuracy": row["mean_accuracy"],
            "clients_at_target": row.get("clients_at_target")}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def ratio(value: float | None, base: float | None) -> str:
    """FL+HC / FL as the paper prints it: '1.3x', '-' where FL's figure is 0."""
    if value is None or base is None:
        return "n/a"
    return "-" if base == 0 else f"{value / base:.2f}x"


def run_section(folder: Path, summary: Record, metrics: Sequence[Record]) -> list[str]:
    """The run report's FL+HC section: dendrogram with the cut, curves, key figures."""
    events = read_jsonl(folder / "events.jsonl") if (folder / "events.jsonl").exists() else []
    event = clustering_event(events)
    marked = clustering_round(metrics)
    curves_plot({"flhc": metrics}, marked, folder / IMAGES["curves"])
    lines = ["## FL+HC", ""]
    if event is None:
        return [*lines, "No clustering round took place (the run ended before round n+1): "
                "the run is FedAvg.", "", f"![curves]({IMAGES['curves']})", ""]
    groups, what = plots.grouping(summary["clustering"])
    dendrogram_plot(event, groups, folder / IMAGES["dendrogram"], what)
    heights = np.asarray(event["tree"], dtype=np.float64)[:, 2] if event["tree"] else \
        np.zeros(0)
    last = int(summary["rounds"])
    shown = first_evaluated(metrics, marked)
    post, end = figures(metrics, shown), figures(metrics, last)
    top = ", ".join(f"{h:.4g}" for h in np.sort(heights)[::-1][:6])
    cut = "none" if event["cut_height"] is None else f"{event['cut_height']:.4g}"
    median = float(np.median(heights)) if len(heights) else 0.0
    ari = summary["clustering"].get("ari")
    scored = "" if ari is None else f"; ARI {ari:.3f} against the true clusters"
    lines += [
        f"- clustering round: at the start of round {marked}, all "
        f"{len(event['clients'])} clients; {event['metric']} distance, {event['linkage']} "
        f"linkage, {cut_rule(event)}, cut at height {cut}",
        f"- clusters: {event['n_clusters']}, sizes {event['cluster_sizes']}{scored}",
        f"- highest merge heights: {top}; median {median:.4g}",
        f"- post-cluster (round {shown}{'' if shown == marked else ', the first evaluated'}): "
        f"mean accuracy {_pct(post['mean_accuracy'])} %, "
        f"clients at target {_pct(post['clients_at_target'])} %",
        f"- round {last}: mean accuracy {_pct(end['mean_accuracy'])} %, clients at target "
        f"{_pct(end['clients_at_target'])} %",
        "", f"![dendrogram]({IMAGES['dendrogram']})", "",
        "Accuracy and clients at target per round; the vertical line is the clustering round.",
        "", f"![curves]({IMAGES['curves']})", ""]
    return lines


def comparison_rows(fedavg: Sequence[Record], flhc: Sequence[Record]
                    ) -> list[dict[str, Any]]:
    """FL+HC beside FL at the post-cluster round and the last round, with their ratios."""
    marked = clustering_round(flhc)
    last = max((int(m["round"]) for m in flhc if "mean_accuracy" in m), default=None)
    rows = []
    shown = first_evaluated(flhc, marked)
    post = "post-cluster" if shown == marked else "first evaluated after clustering"
    for label, rnd in ((post, shown), ("last", last)):
        if rnd is None or (label != "last" and rnd == last):
            continue
        a, b = figures(flhc, rnd), figures(fedavg, rnd)
        rows.append({"label": label, "round": rnd, "flhc": a, "fedavg": b,
                     "accuracy_ratio": ratio(a["mean_accuracy"], b["mean_accuracy"]),
                     "target_ratio": ratio(a["clients_at_target"], b["clients_at_target"])})
    return rows


def comparison_section(folder: Path, runs: Mapping[str, Sequence[Record]],
                       fedavg: str = "fedavg", flhc: str = "flhc") -> list[str]:
    """A comparison report's FL+HC / FL table (the ratio of the paper's tables) and curves."""
    if fedavg not in runs or flhc not in runs:
        return []
    rows = comparison_rows(runs[fedavg], runs[flhc])
    curves_plot({fedavg: runs[fedavg], flhc: runs[flhc]}, clustering_round(runs[flhc]),
                folder / IMAGES["compare"])
    # The target columns only where the runs count clients at eval.target_accuracy.
    target = any(r["flhc"]["clients_at_target"] is not None for r in rows)
    head = "| round | FL+HC acc % | FL acc % | FL+HC / FL |"
    lines = ["## FL+HC against FL (FedAvg)", "",
             head + (" FL+HC % at target | FL % at target | FL+HC / FL |" if target else ""),
             "|---|---|---|---|" + ("---|---|---|" if target else "")]
    for r in rows:
        cells = (f"| {r['label']} ({r['round']}) | {_pct(r['flhc']['mean_accuracy'])} | "
                 f"{_pct(r['fedavg']['mean_accuracy'])} | {r['accuracy_ratio']} |")
        if target:
            cells += (f" {_pct(r['flhc']['clients_at_target'])} | "
                      f"{_pct(r['fedavg']['clients_at_target'])} | {r['target_ratio']} |")
        lines.append(cells)
    lines += ["", "Both runs share their first n rounds (same seed); the vertical line is the "
              "clustering round.", "", f"![FL+HC vs FL]({IMAGES['compare']})", ""]
    return lines


def cut_rule(event: dict[str, Any]) -> str:
    """How the clustering event's tree was cut, in words."""
    chosen = event.get("k_choice")
    if chosen is None:
        return f"threshold {event['threshold']} ({event['threshold_mode']})"
    if chosen["k"] is not None:
        return f"cut into k_choice.k = {chosen['k']}"
    return f"K by the k_choice selector {chosen['selector']}"
