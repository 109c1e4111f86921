"""A committed run's figures and their mean +- std over seeds: pure functions, no torch, so the
reproduction pages (`pages`) are generated from the records without loading the methods."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from clusterfed.errors import ConfigError

Figure = tuple[float, float]
MIN_SEEDS = 3    # the fewest seeds a verdict is given on
PROTOCOLS = ("own", "cluster")   # which of a run's figures a table compares with the paper's


def verdict(paper: Figure, ours: Figure, seeds: int) -> str:
    """The one rule of every table (docs/reproductions/README.md, "Verdict rule"): within
    when |ours - paper| <= 2 sqrt(std_paper^2 + std_ours^2), judged over at least MIN_SEEDS
    seeds."""
    (p, p_std), (m, m_std) = paper, ours
    if m != m:
        return "not measured"
    if seeds < MIN_SEEDS:
        return f"not judged ({seeds} seed{'s' if seeds != 1 else ''} of {MIN_SEEDS})"
    limit = 2 * math.hypot(p_std, m_std)
    gap = m - p
    if abs(gap) <= limit:
        return f"within ({gap:+.2f}, limit {limit:.2f})"
    return f"{'above' if gap > 0 else 'below'} ({gap:+.2f}, limit {limit:.2f})"


def paper_figure(label: str, figure: Any) -> tuple[float, float]:
    """[mean, std] or a mean alone (std 0), in %."""
    values = figure if isinstance(figure, list | tuple) else [figure]
    if not 1 <= len(values) <= 2 or not all(isinstance(v, int | float) for v in values):
        raise ConfigError(f"reproduce.paper.{label} must be a mean or [mean, std] in %, got "
                          f"{figure!r}")
    return float(values[0]), float(values[1]) if len(values) == 2 else 0.0


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value); NaNs left out."""
    a = np.asarray([v for v in values if v == v], dtype=np.float64)
    if len(a) == 0:
        return float("nan"), float("nan")
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def figures(summary: Mapping[str, Any]) -> dict[str, float]:
    """A run's figures; a run with newcomers is scored on them alone (PACFL's Table 3)."""
    final = summary["final"]
    final = final.get("newcomers", final)
    ari = summary["clustering"].get("ari")
    return {"own": 100 * float(final["mean_accuracy"]),
            "cluster": 100 * float(final.get("cluster_mean_accuracy", float("nan"))),
            # No truth (own data): NaN, which the table prints as '-'.
            "ari": float("nan") if ari is None else float(ari),
            "clusters": float(summary["clustering"]["n_clusters"]),
            "seconds": float(summary.get("wall_seconds", float("nan"))),
            # Only a mixture scenario's runs have it (`clustering.shares_error`).
            **({"shares_error": float(summary["clustering"]["shares_error"])}
               if "shares_error" in summary["clustering"] else {})}
