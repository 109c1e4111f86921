"""CFL's figures and the report's "CFL" section, drawn from a run folder's records.

The records: events.jsonl's "split" and "split_rejected" events (round, node, members, parts,
the members' cosine matrix in member order, alpha_cross_max, gamma_bound, mean/max norm, and
for a split its children), metrics.jsonl's per-round "cfl" norms of every leaf, and
summary.json's true assignment. Rounds are the simulator's (1-based) everywhere.

Without a truth (own data) the matrices are grouped by the clusters found instead, and what
needs the truth (the gap g, the leaves' true make-up) is left out.
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
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from clusterfed.algorithms.cfl import maths as cfl_math  # noqa: E402
from clusterfed.report import plots  # noqa: E402
from clusterfed.run_folder import read_jsonl  # noqa: E402

Record = Mapping[str, Any]
TESTS = ("split", "split_rejected")
MAX_PANELS = 6
PART_COLOURS = ("#333333", "#d4a017")   # the split's first and second part
IMAGES = {"similarity": "cfl_similarity.png", "norms": "cfl_norms.png", "gap": "cfl_gap.png",
          "accuracy": "cfl_accuracy.png", "tree": "cfl_tree.png"}


def _true_colour(k: int) -> Any:
    return plt.get_cmap("tab10")(int(k) % 10)


def _node_colour(v: int) -> Any:
    return plt.get_cmap("tab20")(int(v) % 20)


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=100)
    plt.close(fig)


def splits(events: Sequence[Record]) -> list[Record]:
    return [e for e in events if e.get("type") == "split"]


def split_tests(events: Sequence[Record]) -> list[Record]:
    """Every split test whose bipartition was computed: accepted or rejected."""
    return [e for e in events if e.get("type") in TESTS]


def grouped_order(labels: Sequence[int], parts: Sequence[int] | None = None) -> np.ndarray:
    """Positions sorted by true label, then by part, then by position (a stable grouping).

    Sorting by part inside a true cluster keeps a wrongly split true cluster's two halves
    apart, so the mistake shows as a block broken in two.
    """
    labels = np.asarray(labels)
    part = np.zeros(len(labels), dtype=np.int64) if parts is None else np.asarray(parts)
    return np.lexsort((np.arange(len(labels)), part, labels))


def part_index(event: Record) -> np.ndarray:
    """For each member (in member order), 0 or 1: the part of the bipartition it fell in."""
    second = set(event["parts"][1])
    return np.array([int(c in second) for c in event["members"]], dtype=np.int64)


def event_gap(event: Record, true: Sequence[int]) -> float:
    """g(alpha) of a split test: the logged matrix, true labels restricted to the members."""
    labels = np.asarray(true)[np.asarray(event["members"], dtype=np.int64)]
    return cfl_math.separation_gap(np.asarray(event["similarity"], dtype=np.float64), labels)


# 1. The similarity matrix at each split -----------------------------------------------------

def similarity_panels(events: Sequence[Record], true: Sequence[int], path: Path,
                      max_panels: int = MAX_PANELS, what: str = "true") -> int:
    """One panel per split (the first `max_panels`), clients grouped by true cluster.

    Left strip: true cluster; top strip and tick colours: the split's part. Returns the number
    of panels drawn (0 draws nothing). `what`: "found" where `true` holds the clusters found
    (no truth known); the grouping and labels follow them.
    """
    shown = splits(events)[:max_panels]
    if not shown:
        return 0
    cols = min(3, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 1, 4.4 * rows + 0.8),
                             squeeze=False, layout="constrained")
    image = None
    for ax, event in zip(axes.ravel(), shown, strict=False):
        image = _similarity_panel(ax, event, np.asarray(true), what)
    for ax in axes.ravel()[len(shown):]:
        ax.axis("off")
    clusters = sorted({int(t) for t in true})
    handles = [Patch(color=PART_COLOURS[0], label="first part"),
               Patch(color=PART_COLOURS[1], label="second part"),
               *(Patch(color=_true_colour(k), label=f"{what} cluster {k}")
                 for k in clusters[:10])]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6),
               fontsize=8)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.7, label="cosine similarity")
    total = len(splits(events))
    more = f" (the first {len(shown)} of {total} splits)" if total > len(shown) else ""
    fig.suptitle("Cosine similarity of the members' updates at each split, grouped by "
                 f"{what} cluster{more}", fontsize=10)
    _save(fig, path)
    return len(shown)


def _similarity_panel(ax: Any, event: Record, true: np.ndarray, what: str) -> Any:
    members = np.asarray(event["members"], dtype=np.int64)
    labels = true[members]
    part = part_index(event)
    order = grouped_order(labels, part)
    s = np.asarray(event["similarity"], dtype=np.float64)[np.ix_(order, order)]
    m = len(order)
    image = ax.imshow(s, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    # The strips live inside the axes, beyond the matrix, so nothing is clipped or overlaps.
    w = max(0.6, 0.06 * m)
    for i, pos in enumerate(order):
        ax.add_patch(Rectangle((i - 0.5, -0.5 - w), 1, 0.85 * w, lw=0,
                               color=PART_COLOURS[part[pos]]))
        ax.add_patch(Rectangle((-0.5 - w, i - 0.5), 0.85 * w, 1, lw=0,
                               color=_true_colour(labels[pos])))
    ax.set_xlim(-0.5 - w, m - 0.5)
    ax.set_ylim(m - 0.5, -0.5 - w)
    # Thin lines between the (true or found) cluster blocks.
    for b in np.flatnonzero(np.diff(labels[order])) + 0.5:
        ax.plot([b, b], [-0.5, m - 0.5], color="white", lw=1.2)
        ax.plot([-0.5, m - 0.5], [b, b], color="white", lw=1.2)
    if m <= 30:
        ticks = [str(c) for c in members[order]]
        ax.set_xticks(range(m), ticks, fontsize=7, rotation=90)
        ax.set_yticks(range(m), ticks, fontsize=7)
        for axis in (ax.get_xticklabels(), ax.get_yticklabels()):
            for lab, pos in zip(axis, order, strict=True):
                lab.set_color(PART_COLOURS[part[pos]])
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    children = event.get("children")
    arrow = f" -> {children[0]} | {children[1]}" if children else ""
    ax.set_title(f"round {event['round']}, node {event['node']}{arrow}\n"
                 f"α_cross_max {event['alpha_cross_max']:.3f}, "
                 f"γ bound {event['gamma_bound']:.3f}", fontsize=9)
    return image


# 2. Norms over rounds (Fig. 7) --------------------------------------------------------------

def norm_series(metrics: Sequence[Record]) -> dict[int, dict[str, list[float]]]:
    """Per leaf node id: the rounds it reported, its mean norms and its max norms."""
    series: dict[int, dict[str, list[float]]] = {}
    for m in metrics:
        for node, info in (m.get("cfl") or {}).items():
            s = series.setdefault(int(node), {"round": [], "mean_norm": [], "max_norm": []})
            s["round"].append(m["round"])
            s["mean_norm"].append(info["mean_norm"])
            s["max_norm"].append(info["max_norm"])
    return series


def _mark_tests(ax: Any, events: Sequence[Record], label: bool) -> None:
    """Vertical lines: dashed grey at splits, dotted red at rejected split tests."""
    for e in split_tests(events):
        accepted = e["type"] == "split"
        ax.axvline(e["round"], color="grey" if accepted else "tab:red",
                   ls="--" if accepted else ":", lw=1, alpha=0.8, zorder=0)
        if label and accepted:
            ax.annotate(f"{e['node']}", (e["round"], 1), xycoords=("data", "axes fraction"),
                        xytext=(2, -10), textcoords="offset points", fontsize=7, color="grey")


def _test_handles(events: Sequence[Record]) -> list[Line2D]:
    handles = []
    if splits(events):
        handles.append(Line2D([], [], color="grey", ls="--", lw=1, label="split (node id)"))
    if len(split_tests(events)) > len(splits(events)):
        handles.append(Line2D([], [], color="tab:red", ls=":", lw=1, label="split rejected"))
    return handles


def norm_curves(metrics: Sequence[Record], events: Sequence[Record], path: Path) -> None:
    """Mean and max update norm of every cluster per round; a leaf's lines end at its split."""
    series = norm_series(metrics)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for node, s in sorted(series.items()):
        style = {"color": _node_colour(node), "lw": 1.5,
                 "marker": "." if len(s["round"]) < 3 else None}
        top.plot(s["round"], s["mean_norm"], label=f"node {node}", **style)
        bottom.plot(s["round"], s["max_norm"], **style)
    for ax, what in ((top, "‖mean update‖ of the cluster"), (bottom, "max client ‖update‖")):
        _mark_tests(ax, events, label=ax is top)
        ax.set(ylabel=what, ylim=(0, None))
        ax.grid(alpha=0.3)
    bottom.set(xlabel="round")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_title("Update norms per cluster (leaf node id) over rounds", fontsize=10)
    handles, _ = top.get_legend_handles_labels()
    top.legend(handles=handles + _test_handles(events), fontsize=7,
               ncol=max(1, math.ceil(len(handles) / 8)))
    fig.tight_layout()
    _save(fig, path)


# 3. The separation gap at each split test ---------------------------------------------------

def gap_points(events: Sequence[Record], true: Sequence[int]) -> list[dict[str, Any]]:
    """(round, node, accepted, gap) of every split test, in event order."""
    return [{"round": e["round"], "node": e["node"], "accepted": e["type"] == "split",
             "gap": event_gap(e, true)} for e in split_tests(events)]


def gap_series(metrics: Sequence[Record]) -> dict[int, tuple[list[int], list[float]]]:
    """Per node, the rounds and the g(alpha) the simulator logged for it every round."""
    series: dict[int, tuple[list[int], list[float]]] = {}
    for m in metrics:
        for node, gap in m.get("separation_gap", {}).items():
            rounds, gaps = series.setdefault(int(node), ([], []))
            rounds.append(m["round"])
            gaps.append(gap)
    return series


def gap_curves(events: Sequence[Record], true: Sequence[int], path: Path,
               metrics: Sequence[Record] = ()) -> bool:
    """g(alpha) per node over rounds, split tests marked; False, drawing nothing, if no data."""
    points = gap_points(events, true)
    series = gap_series(metrics)
    if not points and not series:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for node, (rounds, gaps) in sorted(series.items()):
        ax.plot(rounds, gaps, color=_node_colour(node), lw=1)
    for node in sorted({p["node"] for p in points}):
        mine = [p for p in points if p["node"] == node]
        colour = _node_colour(node)
        if len(mine) > 1 and node not in series:
            ax.plot([p["round"] for p in mine], [p["gap"] for p in mine], color=colour, lw=1)
        for p in mine:
            ax.scatter(p["round"], p["gap"], color=colour, zorder=3, s=40,
                       marker="o" if p["accepted"] else "x")
            ax.annotate(f"{node}", (p["round"], p["gap"]), xytext=(4, 4),
                        textcoords="offset points", fontsize=7)
    ax.axhline(0, color="black", lw=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    ax.set(xlabel="round", ylabel="g(α) = α_intra_min − α_cross_max",
           title="Separation gap per cluster over rounds; markers: split tests (node id)")
    ax.title.set_fontsize(10)
    ax.legend(handles=[
        Line2D([], [], color="grey", marker="o", ls="", label="split"),
        Line2D([], [], color="grey", marker="x", ls="", label="split rejected"),
    ], fontsize=8, title="g > 0: the bipartition is correct", title_fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    return True


# 4. Accuracy with split markers (Fig. 8) ----------------------------------------------------

def accuracy_with_splits(metrics: Sequence[Record], events: Sequence[Record], path: Path) -> None:
    """Mean and per-true-cluster (else per found cluster) accuracy over evaluated rounds, split
    rounds marked."""
    rows = [m for m in metrics if "mean_accuracy" in m]
    rounds = [m["round"] for m in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    what, series = plots.cluster_series(rows)
    for k, values in series.items():
        ax.plot(rounds, values, color=_true_colour(int(k)), lw=1, alpha=0.7, marker=".",
                label=f"{what} cluster {k}")
    ax.plot(rounds, [m["mean_accuracy"] for m in rows], color="black", lw=2, marker=".",
            label="mean")
    _mark_tests(ax, events, label=True)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="round", ylabel="client test accuracy", ylim=(0, 1))
    ax.set_title("Accuracy over rounds with CFL's splits", fontsize=10)
    ax.grid(alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + _test_handles(events), fontsize=7, loc="lower right")
    fig.tight_layout()
    _save(fig, path)


# 5. The parameter tree ----------------------------------------------------------------------

def tree_from_events(events: Sequence[Record], n_clients: int) -> dict[int, dict[str, Any]]:
    """Node id -> members, children and split round, rebuilt from the split events.

    Members are as at the node's creation (or split): later newcomers and leavers are not shown.
    Without splits the tree is the root holding every client.
    """
    first = splits(events)
    root = first[0]["members"] if first else list(range(n_clients))
    tree: dict[int, dict[str, Any]] = {0: {"members": list(root), "children": [], "round": None}}
    for e in first:
        node = tree.setdefault(e["node"], {"members": [], "children": [], "round": None})
        node.update(members=list(e["members"]), children=list(e["children"]), round=e["round"])
        # split_leaf gives children[i] the members of parts[i].
        for child, part in zip(e["children"], e["parts"], strict=True):
            tree[child] = {"members": sorted(part), "children": [], "round": None}
    return tree


def tree_layout(tree: Mapping[int, Mapping[str, Any]]) -> dict[int, tuple[float, int]]:
    """(x, depth) per node: leaves at 0, 1, 2, ... left to right, parents above their children."""
    place: dict[int, tuple[float, int]] = {}
    next_leaf = [0]

    def visit(v: int, depth: int) -> float:
        children = tree[v]["children"]
        if children:
            x = float(np.mean([visit(c, depth + 1) for c in children]))
        else:
            x = float(next_leaf[0])
            next_leaf[0] += 1
        place[v] = (x, depth)
        return x

    visit(0, 0)
    return place


def composition(members: Sequence[int], true: Sequence[int]) -> dict[int, int]:
    """True cluster -> how many of `members` belong to it."""
    labels, counts = np.unique(np.asarray(true)[np.asarray(members, dtype=np.int64)],
                               return_counts=True)
    return {int(k): int(n) for k, n in zip(labels, counts, strict=True)}


def parameter_tree(events: Sequence[Record], true: Sequence[int] | None, path: Path,
                   n_clients: int | None = None) -> None:
    """The tree of splits; a leaf shows its members' true clusters (coloured if pure).

    `true` None (no truth known; give `n_clients`): a leaf shows its size and members, uncoloured.
    """
    tree = tree_from_events(events, len(true) if true is not None else int(n_clients or 0))
    place = tree_layout(tree)
    leaves = sum(1 for v in tree.values() if not v["children"])
    depth = max(d for _, d in place.values())
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * leaves + 1), 1.6 * depth + 2.4))
    for v, node in tree.items():
        x, d = place[v]
        for c in node["children"]:
            cx, cd = place[c]
            ax.plot([x, cx], [-d, -cd], color="grey", lw=1, zorder=1)
    for v, node in tree.items():
        x, d = place[v]
        size = len(node["members"])
        if node["children"]:
            text = f"node {v}\n{size} clients\nsplit r{node['round']}"
            face = "white"
        elif true is None:
            text = f"node {v}\n{size} clients\n" + _member_text(node["members"])
            face = "white"
        else:
            parts = composition(node["members"], true)
            text = f"node {v}\n" + "\n".join(f"T{k}: {n}" for k, n in parts.items())
            face = _true_colour(next(iter(parts))) if len(parts) == 1 else "#dddddd"
        ax.text(x, -d, text, ha="center", va="center", fontsize=8, zorder=2,
                bbox={"boxstyle": "round", "facecolor": face, "alpha": 0.85, "edgecolor": "black"})
    ax.set_xlim(-0.7, leaves - 0.3)
    ax.set_ylim(-depth - 0.7, 0.7)
    ax.axis("off")
    ax.set_title("Parameter tree\nleaves: " + (
        "members by true cluster Tk, as at their creation; coloured if pure" if true is not None
        else "members as at their creation"), fontsize=9)
    fig.tight_layout()
    _save(fig, path)


def _member_text(members: Sequence[int], per_line: int = 4, most: int = 12) -> str:
    """A leaf's member ids, a few per line, cut at `most`."""
    ids = [str(int(c)) for c in members[:most]]
    rows = [", ".join(ids[i:i + per_line]) for i in range(0, len(ids), per_line)]
    if len(members) > most:
        rows.append(f"+{len(members) - most} more")
    return "\n".join(rows)


# The report section ---------------------------------------------------------------------------

def split_table(events: Sequence[Record], true: Sequence[int] | None) -> list[str]:
    """A markdown table, one row per split event; without a truth, no gap g (n/a)."""
    lines = ["| round | node | children | sizes | alpha_cross_max | gamma bound | gap g |",
             "|---:|---:|---|---|---:|---:|---:|"]
    for e in splits(events):
        sizes = " + ".join(str(len(p)) for p in e["parts"])
        children = ", ".join(str(c) for c in e["children"])
        lines.append(f"| {e['round']} | {e['node']} | {children} | {sizes} | "
                     f"{e['alpha_cross_max']:.4f} | {e['gamma_bound']:.4f} | "
                     + ("n/a" if true is None else f"{event_gap(e, true):.4f}") + " |")
    return lines


def run_section(folder: Path, summary: Record, metrics: Sequence[Record]) -> list[str]:
    """Draw the CFL figures into `folder`; returns the report's "## CFL" section as lines."""
    events = read_jsonl(folder / "events.jsonl")
    true = summary["clustering"]["true_assignment"]
    groups, what = plots.grouping(summary["clustering"])
    found, tests = splits(events), split_tests(events)
    rejected = len(tests) - len(found)
    refused = f"{rejected} split test{'' if rejected == 1 else 's'} rejected"
    gap_note = ("The gap g is alpha_intra_min (true labels) minus alpha_cross_max; g > 0 "
                "guarantees a correct bipartition." if true is not None else
                "The gap g needs the true clusters, which are unknown (own data).")
    lines = ["## CFL", ""]
    if found:
        lines += [f"{len(found)} split{'' if len(found) == 1 else 's'} ({refused}). {gap_note}",
                  "", *split_table(events, true), ""]
    else:
        lines += [f"No split happened ({refused}).", ""]
    shown = similarity_panels(events, groups, folder / IMAGES["similarity"], what=what)
    if shown:
        more = f" (the first {shown} of {len(found)})" if len(found) > shown else ""
        lines += [f"### Similarity of the members' updates at each split{more}", "",
                  f"Clients grouped by {what} cluster (left strip); top strip and tick colours: "
                  "the split's two parts.", "", f"![similarity]({IMAGES['similarity']})", ""]
    else:
        (folder / IMAGES["similarity"]).unlink(missing_ok=True)  # no stale figure
    norm_curves(metrics, events, folder / IMAGES["norms"])
    lines += ["### Update norms per cluster (Fig. 7)", "", f"![norms]({IMAGES['norms']})", ""]
    lines += ["### Separation gap over rounds", ""]
    if true is not None and gap_curves(events, true, folder / IMAGES["gap"], metrics):
        lines += [f"![gap]({IMAGES['gap']})", ""]
    else:
        (folder / IMAGES["gap"]).unlink(missing_ok=True)
        lines += ["No split test was run, so there is no gap to show." if true is not None
                  else "Not shown: the gap needs the true clusters.", ""]
    accuracy_with_splits(metrics, events, folder / IMAGES["accuracy"])
    parameter_tree(events, true, folder / IMAGES["tree"], n_clients=len(groups))
    lines += ["### Accuracy with split markers (Fig. 8)", "",
              f"![accuracy with splits]({IMAGES['accuracy']})", "",
              "### Parameter tree", "", f"![tree]({IMAGES['tree']})", ""]
    return lines
