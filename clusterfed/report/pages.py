"""report.md for a run folder or a comparison folder."""

from __future__ import annotations

import json
from pathlib import Path

from clusterfed.errors import ConfigError
from clusterfed.experiments.compare import format_table, table_rows
from clusterfed.report import cfl_plots, flhc_plots, ifca_plots, lcfl_plots, pacfl_plots, plots
from clusterfed.sim.outputs import read_config, read_jsonl


def write_report(folder: str | Path) -> Path:
    """Write report.md (and its PNGs) into a run or comparison folder; returns its path."""
    folder = Path(folder)
    if (folder / "comparison.json").exists():
        return _comparison_report(folder)
    if (folder / "summary.json").exists():
        return _run_report(folder)
    raise ConfigError(f"{folder} holds neither summary.json nor comparison.json: "
                      "not a finished run or comparison folder")


def _run_report(folder: Path) -> Path:
    summary = json.loads((folder / "summary.json").read_text())
    metrics = read_jsonl(folder / "metrics.jsonl")
    clustering = summary["clustering"]
    plots.accuracy_curves(metrics, folder / "accuracy.png")
    plots.per_client_bars(summary["final"]["per_client_accuracy"], clustering["true_assignment"],
                          folder / "per_client.png")
    plots.cluster_matrix(clustering["true_assignment"], clustering["assignment"],
                         folder / "clusters.png")
    lines = [
        f"# {summary['algorithm']}: {summary['rounds']} rounds, seed {summary['seed']}",
        "",
        f"- mean client accuracy: {summary['final']['mean_accuracy']:.4f}",
        f"- clusters found: {clustering['n_clusters']}; ARI {clustering['ari']:.3f}, "
        f"NMI {clustering['nmi']:.3f} against the true clusters",
        f"- wall time: {summary['wall_seconds']:.1f} s",
        "",
        "## Accuracy per round", "", "![accuracy](accuracy.png)", "",
        "## Final accuracy per client (colour: true cluster)", "", "![clients](per_client.png)",
        "",
        "## Found clusters against true clusters", "", "![clusters](clusters.png)", "",
    ]
    if summary["algorithm"] == "cfl":
        lines += cfl_plots.cfl_section(folder, summary, metrics)
    if summary["algorithm"] == "ifca":
        lines += ifca_plots.ifca_section(folder, summary, metrics)
    if summary["algorithm"] == "pacfl":
        config = read_config(folder) if (folder / "config.yaml").exists() else {}
        lines += pacfl_plots.pacfl_section(folder, summary, metrics, config)
    if summary["algorithm"] == "flhc":
        lines += flhc_plots.flhc_section(folder, summary, metrics)
    if summary["algorithm"] == "lcfl":
        lines += lcfl_plots.lcfl_section(folder, summary, metrics)
    path = folder / "report.md"
    path.write_text("\n".join(lines))
    return path


def _comparison_report(folder: Path) -> Path:
    comparison = json.loads((folder / "comparison.json").read_text())
    runs = {}
    for name in comparison["algorithms"]:
        if (folder / name / "summary.json").exists():
            _run_report(folder / name)
        runs[name] = read_jsonl(folder / name / "metrics.jsonl")
    plots.compare_curves(runs, folder / "accuracy.png")
    lines = ["# Comparison", "", "```", format_table(table_rows(comparison)), "```", "",
             "![accuracy](accuracy.png)", "",
             "Each algorithm's own report: " + ", ".join(
                 f"[{n}]({n}/report.md)" for n in comparison["algorithms"]), ""]
    if "pacfl" in runs and (folder / "config.yaml").exists():
        participation = float(read_config(folder)["train"]["participation"])
        lines += ["## Rounds to target and the paper's cost (PACFL Tables 4, 8, 9)", "",
                  *pacfl_plots.targets_table(runs, participation,
                                             pacfl_plots.model_size(runs["pacfl"])), ""]
    if {"fedavg", "flhc"} <= set(runs):
        lines += flhc_plots.comparison_section(folder, runs)
    path = folder / "report.md"
    path.write_text("\n".join(lines))
    return path
