"""The IFCA section of a run's report: every client's cluster choice per round, and ARI
(where the true clusters are known)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from clusterfed.report import plots  # noqa: E402
from clusterfed.run_folder import read_jsonl  # noqa: E402

Record = Mapping[str, Any]
UNKNOWN = -1


def choice_matrix(events: Sequence[Record], num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, clients) of the chosen cluster from `ifca_choices` events, -1 where a client
    made no choice that round; and the rounds (1-based) as the rows' labels."""
    chosen = [e for e in events if e.get("type") == "ifca_choices"]
    rounds = np.array(sorted({int(e["round"]) for e in chosen}), dtype=np.int64)
    out = np.full((len(rounds), num_clients), UNKNOWN, dtype=np.int64)
    row = {r: i for i, r in enumerate(rounds.tolist())}
    for e in chosen:
        out[row[int(e["round"])], np.asarray(e["clients"], dtype=np.int64)] = e["clusters"]
    return out, rounds


def choices_plot(matrix: np.ndarray, rounds: np.ndarray, true: Sequence[int], path: Path,
                 what: str = "true") -> None:
    """Clients (grouped by true cluster, or by `what` cluster `true` holds) against rounds,
    coloured by the chosen cluster."""
    order = np.argsort(np.asarray(true), kind="stable")
    shown = np.ma.masked_equal(matrix[:, order].T, UNKNOWN)
    fig, ax = plt.subplots(figsize=(7, 4))
    k = max(int(matrix.max()) + 1, 1)
    cmap = plt.get_cmap("tab10", k).with_extremes(bad="lightgrey")
    image = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap=cmap,
                      vmin=-0.5, vmax=k - 0.5,
                      extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(order) - 0.5, -0.5))
    bounds = np.flatnonzero(np.diff(np.asarray(true)[order])) + 0.5
    for b in bounds:
        ax.axhline(b, color="white", lw=1.5)
    ax.set(xlabel="round", ylabel=f"client (grouped by {what} cluster)")
    fig.colorbar(image, ax=ax, ticks=range(k), label="chosen cluster")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ari_plot(metrics: Sequence[Record], path: Path) -> bool:
    """ARI per evaluated round; False, drawing nothing, where no round was scored (no truth)."""
    rows = [m for m in metrics if m.get("ari") is not None]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([m["round"] for m in rows], [m["ari"] for m in rows], marker=".", color="black")
    ax.set(xlabel="round", ylabel="ARI against the true clusters", ylim=(-0.1, 1.05))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def run_section(folder: Path, summary: Record, metrics: Sequence[Record]) -> list[str]:
    """Draw the IFCA figures into `folder`; returns the report's "## IFCA" section as lines."""
    events = read_jsonl(folder / "events.jsonl")
    groups, what = plots.grouping(summary["clustering"])
    lines = ["## IFCA", ""]
    selected = [e for e in events if e.get("type") == "ifca_restart_selected"]
    for e in selected:
        lines += [f"Restarts: round {e['round']} kept candidate set {e['set']} (losses "
                  f"{', '.join(f'{v:.4f}' for v in e['objective'])}).", ""]
    matrix, rounds = choice_matrix(events, len(groups))
    if len(rounds):
        choices_plot(matrix, rounds, groups, folder / "ifca_choices.png", what)
        lines += ["### Each client's choice per round", "",
                  "Grey: no choice that round (not sampled).", "",
                  "![choices](ifca_choices.png)", ""]
    if ari_plot(metrics, folder / "ifca_ari.png"):
        lines += ["### ARI over rounds", "", "![ari](ifca_ari.png)", ""]
    else:
        (folder / "ifca_ari.png").unlink(missing_ok=True)   # no stale figure of a truth
    return lines
