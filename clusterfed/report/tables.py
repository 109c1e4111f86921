"""The comparison table: one row per algorithm of a comparison's summaries, as `clusterfed
compare` prints it and report.md shows it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from clusterfed.clustering.metrics import score_text


def table_rows(comparison: Mapping[str, Any]) -> list[list[str]]:
    """The comparison table; ARI is n/a for a federation without a truth (own data)."""
    summaries = [comparison["summaries"][name] for name in comparison["algorithms"]]
    # Runs with newcomers also show the newcomers' figures (PACFL's Table 3): their own
    # models' mean and the served models' as received (cluster), where scored.
    late = any("newcomers" in s["final"] for s in summaries)
    # A client not evaluated (a node that never replied) is named, not silently averaged out.
    missing = any(s["final"].get("unevaluated_clients") for s in summaries)
    rows = [["algorithm", "mean acc", *(["newcomers", "as received"] if late else []),
             "ARI", "clusters", "seconds", *(["not evaluated"] if missing else [])]]
    for name, s in zip(comparison["algorithms"], summaries, strict=True):
        news = s["final"].get("newcomers", {})
        extra = [f"{news[k]:.4f}" if k in news else "-"
                 for k in ("mean_accuracy", "cluster_mean_accuracy")] if late else []
        rows.append([name, score_text(s["final"]["mean_accuracy"], 4), *extra,
                     score_text(s["clustering"].get("ari")),
                     str(s["clustering"]["n_clusters"]), f"{s['wall_seconds']:.1f}",
                     *([",".join(map(str, s["final"].get("unevaluated_clients", []))) or "-"]
                       if missing else [])])
    return rows


def format_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
