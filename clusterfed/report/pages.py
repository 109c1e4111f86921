"""report.md for a run folder or a comparison folder."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from clusterfed.algorithms import ALGORITHMS
from clusterfed.clustering.metrics import score_text
from clusterfed.errors import ConfigError
from clusterfed.report import plots
from clusterfed.report.tables import format_table, table_rows
from clusterfed.report.truth import read_truth, rescored, score_rows
from clusterfed.run_folder import read_jsonl


def write_report(folder: str | Path, truth_file: str | Path | None = None) -> Path:
    """Write report.md (and its PNGs) into a run or comparison folder; returns its path.

    `truth_file`: score the clustering against the true clusters it gives (see
    `clusterfed.report.truth`), e.g. a run on own data whose truth is known afterwards.
    """
    folder = Path(folder)
    truth = None if truth_file is None else read_truth(truth_file)
    if (folder / "comparison.json").exists():
        return _comparison_report(folder, truth, str(truth_file))
    if (folder / "summary.json").exists():
        return _run_report(folder, truth, str(truth_file))
    raise ConfigError(f"{folder} holds neither summary.json nor comparison.json: "
                      "not a finished run or comparison folder")


def _records(folder: Path, truth: np.ndarray | None, source: str
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's summary and metrics records, rescored against `truth` if given."""
    summary = json.loads((folder / "summary.json").read_text())
    metrics = read_jsonl(folder / "metrics.jsonl")
    if truth is None:
        return summary, metrics
    return rescored(summary, metrics, read_jsonl(folder / "events.jsonl"), truth, source)


def unevaluated_text(accuracy: np.ndarray) -> str:
    """', over 3 of 4 clients; not evaluated: client 2', or '' when every client was."""
    missing = np.flatnonzero(np.isnan(accuracy))
    if not len(missing):
        return ""
    return (f", over {len(accuracy) - len(missing)} of {len(accuracy)} clients; not evaluated "
            f"(no reply, or no test data): client{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing))}")


def _clustering_line(clustering: Mapping[str, Any]) -> str:
    head = f"- clusters found: {clustering['n_clusters']}"
    if clustering.get("ari") is None:
        # Own data: nothing to score against; say how to score it, print no figure.
        return (f"{head}; the true clusters are unknown (own data), so the clustering is not "
                "scored (`clusterfed report RUN --truth FILE` scores it against a known truth)")
    scores = f"ARI {clustering['ari']:.3f}, NMI {clustering['nmi']:.3f}"
    if "truth_file" in clustering:
        return f"{head}; {scores} against the true clusters in {clustering['truth_file']}"
    # A scenario's second groupings (a corruption, noisy labels), scored by the run too.
    also = "".join(f"; ARI {score_text(g['ari'])}, NMI {score_text(g['nmi'])} against the "
                   f"{name} grouping" for name, g in clustering.get("groupings", {}).items())
    return f"{head}; {scores} against the true clusters{also}"


def _run_report(folder: Path, truth: np.ndarray | None = None, source: str = "") -> Path:
    summary, metrics = _records(folder, truth, source)
    clustering = summary["clustering"]
    known = clustering["true_assignment"] is not None
    _, what = plots.grouping(clustering)
    # null (NaN): a client not evaluated (a node that never replied, no test data).
    accuracy = np.asarray(summary["final"]["per_client_accuracy"], dtype=np.float64)
    if "clusters" not in run_figures(summary, metrics, folder):
        (folder / "clusters.png").unlink(missing_ok=True)   # no stale figure of a truth
    lines = [
        f"# {summary['algorithm']}: {summary['rounds']} rounds, seed {summary['seed']}",
        "",
        f"- mean client accuracy: {score_text(summary['final']['mean_accuracy'], 4)}"
        f"{unevaluated_text(accuracy)}",
        _clustering_line(clustering),
        f"- wall time: {summary['wall_seconds']:.1f} s",
        "",
        "## Accuracy per round", "", "![accuracy](accuracy.png)", "",
        f"## Final accuracy per client (colour: {what} cluster)", "",
        "![clients](per_client.png)", "",
        "## Clusters found", "", *plots.found_clusters(clustering["assignment"], accuracy), "",
    ]
    if known:
        lines += ["## Found clusters against true clusters", "", "![clusters](clusters.png)", ""]
    if "truth_file" in clustering:
        lines += ["## Scores per round", "",
                  "Against the truth file, of the clustering in force at each evaluated round.",
                  "", *score_rows(metrics), ""]
    section = ALGORITHMS.report_module(summary["algorithm"])
    if section is not None:
        lines += section.run_section(folder, summary, metrics)
    path = folder / "report.md"
    path.write_text("\n".join(lines))
    return path


# What the table's ARI column means, for a reader who has not met it.
ARI_MEANING = ("ARI (adjusted Rand index) compares the clients' clusters a method found with "
               "the true clusters: 1 is the same grouping, about 0 no better than chance; "
               "a method without clusters puts every client in one, which scores 0 wherever "
               "there are several true clusters.")


def federation_lines(config: Mapping[str, Any] | None,
                     summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the compared methods ran on (dataset, scenario, clients, true clusters) and what
    ARI means: the top of a comparison's report."""
    truth = next((s["clustering"].get("true_assignment") for s in summaries.values()
                  if s["clustering"].get("true_assignment") is not None), None)
    clients = next((len(s["clustering"]["assignment"]) for s in summaries.values()), None)
    if config is None:
        what = "The federation's config is not in this folder."
    else:
        scenario = config.get("scenario", {})
        data = config.get("data", {}).get("dataset", "?")
        kind = scenario.get("kind") if data != "folders" else "own client folders"
        clusters = (f"{len(set(truth))} true clusters" if truth is not None
                    else "true clusters unknown")
        what = (f"The federation: {data}, scenario {kind}, {clients} clients in {clusters}; "
                f"model {config.get('model', {}).get('name', '?')}, "
                f"{config.get('train', {}).get('rounds', '?')} rounds, seed "
                f"{config.get('seed', '?')}.")
    return [what, "", ARI_MEANING if truth is not None else
            "ARI is n/a: the true clusters are unknown.", ""]


def run_figures(summary: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]], folder: Path
                ) -> dict[str, Path]:
    """A run report's figures drawn into `folder`, name -> PNG: accuracy per round, final
    accuracy per client, and found against true clusters where the truth is known."""
    clustering = summary["clustering"]
    groups, what = plots.grouping(clustering)
    paths = {"accuracy": folder / "accuracy.png", "per_client": folder / "per_client.png"}
    plots.accuracy_curves(metrics, paths["accuracy"])
    # null (NaN): a client not evaluated, marked so in the bars.
    accuracy = np.asarray(summary["final"]["per_client_accuracy"], dtype=np.float64)
    plots.per_client_bars(accuracy, groups, paths["per_client"], f"{what} cluster")
    if clustering["true_assignment"] is not None:
        paths["clusters"] = folder / "clusters.png"
        plots.cluster_matrix(clustering["true_assignment"], clustering["assignment"],
                             paths["clusters"])
    return paths


def _comparison_report(folder: Path, truth: np.ndarray | None = None, source: str = ""
                       ) -> Path:
    comparison = json.loads((folder / "comparison.json").read_text())
    runs = {}
    for name in comparison["algorithms"]:
        if (folder / name / "summary.json").exists():
            _run_report(folder / name, truth, source)
            if truth is not None:   # the table's ARI too, against the same truth
                comparison["summaries"][name] = _records(folder / name, truth, source)[0]
        runs[name] = read_jsonl(folder / name / "metrics.jsonl")
    plots.compare_curves(runs, folder / "accuracy.png",
                         {name: comparison["summaries"].get(name, {}).get("algorithm", name)
                          for name in runs})
    scored = [f"ARI against the true clusters in {source}.", ""] if truth is not None else []
    config = yaml.safe_load((folder / "config.yaml").read_text()) \
        if (folder / "config.yaml").exists() else None
    lines = ["# Comparison", "", *federation_lines(config, comparison["summaries"]),
             "```", format_table(table_rows(comparison)), "```", "",
             *scored, "![accuracy](accuracy.png)", "",
             "Each algorithm's own report: " + ", ".join(
                 f"[{n}]({n}/report.md)" for n in comparison["algorithms"]), ""]
    for name in runs:
        section = ALGORITHMS.report_module(name) if name in ALGORITHMS else None
        if section is not None and hasattr(section, "comparison_section"):
            lines += section.comparison_section(folder, runs)
    path = folder / "report.md"
    path.write_text("\n".join(lines))
    return path
