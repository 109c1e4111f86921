"""`reproduce`: a paper preset over its seeds, every listed algorithm, one table beside the paper.

A preset's `reproduce` section says what the paper reported:

    reproduce:
      seeds: [0, 1, 2]                 # default [0, 1, 2]
      algorithms: [fedavg, pacfl]      # default: compare.algorithms, else the preset's algorithm
      paper:                           # label -> [mean, std] in %, or a mean alone
        pacfl: [97.54, 0.08]
        fedavg: [77.3, 4.9]
      protocol: own                    # the table's one figure the paper's is compared
                                       # with: "own" (eval.protocol's own-model figure) or
                                       # "cluster" (the served model, eval.also_cluster)
      not_comparable:                  # label -> why its paper figure is of another kind
        fedavg: the paper's cell is the global model's accuracy   # (shown, not judged)

Every (algorithm, seed) runs in its own folder `LABEL/seed-S`: a finished run (summary.json) is
read back, a cut-off one resumes from its checkpoint, so the command can be rerun until done;
`--finished` writes the table of the runs finished so far, running nothing, each row marked
with its seeds where it has fewer than the table. The table always covers the preset's
algorithms and seeds besides any named: running one more (algorithm, seed) into a folder
keeps the rows of the runs already finished there.
The table gives mean +- std over the seeds of each protocol's figure, ARI, clusters and wall
time, and the verdict of the reproduction pages' one rule (`records.verdict`): within when
|ours - paper| <= 2 sqrt(std_paper^2 + std_ours^2), over at least 3 seeds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed import strict_json
from clusterfed.errors import ConfigError
from clusterfed.experiments.compare import labelled_sections, run_config_of
from clusterfed.experiments.records import PROTOCOLS, figures, mean_std, paper_figure, verdict
from clusterfed.experiments.resumable import Job, check_folder, run_jobs, threads_per_job
from clusterfed.state import save_atomic

REPRODUCE_KEYS = {"seeds", "algorithms", "paper", "protocol", "not_comparable"}


def check_reproduce(section: Mapping[str, Any]) -> None:
    if "paper_protocol" in section:
        raise ConfigError("reproduce.paper_protocol (a protocol a row) is replaced by one a "
                          "table: reproduce.protocol (own or cluster), and a row whose paper "
                          "figure is of another kind goes in reproduce.not_comparable with "
                          "its reason")
    unknown = set(section) - REPRODUCE_KEYS
    if unknown:
        raise ConfigError(f"reproduce: unknown keys {sorted(unknown)}; valid: "
                          f"{sorted(REPRODUCE_KEYS)}")
    seeds = section.get("seeds", [0, 1, 2])
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(f"reproduce.seeds must be a non-empty list of whole numbers, got "
                          f"{seeds!r}")
    for label, figure in dict(section.get("paper", {})).items():
        paper_figure(label, figure)
    if section.get("protocol", "own") not in PROTOCOLS:
        raise ConfigError(f"reproduce.protocol must be one of {', '.join(PROTOCOLS)}, got "
                          f"{section['protocol']!r}")
    reasons = section.get("not_comparable", {}) or {}
    if not isinstance(reasons, Mapping) or not all(
            isinstance(why, str) and why.strip() for why in reasons.values()):
        raise ConfigError("reproduce.not_comparable must map each label to its reason, "
                          f"got {reasons!r}")


def runs_of(config: Mapping[str, Any], names: Sequence[str] | None = None
            ) -> list[tuple[str, dict[str, Any]]]:
    """(label, algorithm section) of each algorithm to reproduce."""
    section = config.get("reproduce", {})
    listed = names or section.get("algorithms")
    if listed is None and not config["compare"]["algorithms"]:
        return [(str(config["algorithm"]["name"]), dict(config["algorithm"]))]
    return labelled_sections(config, [str(n) for n in listed] if listed else None)


def same_run(config: Mapping[str, Any], folder: Path) -> bool:
    """Whether the run in `folder` is of `config` (`check_folder`'s rule)."""
    try:
        check_folder(config, folder)
    except ConfigError:
        return False
    return True


def reproduce(config: Mapping[str, Any], out_dir: str | Path, *,
              names: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
              data_dir: str | None = None,
              progress: Callable[[str], None] | None = None,
              finished_only: bool = False, jobs: int = 1) -> dict[str, Any]:
    """Run every (algorithm, seed); write reproduce.json and reproduce.md; return the result.

    `finished_only`: run nothing; tabulate the finished runs (a long reproduction's table
    while its other runs are still to come), each row over the seeds it has. `jobs`: runs at
    a time, each in its own process (`run_jobs`)."""
    section = dict(config.get("reproduce", {}))
    check_reproduce(section)
    preset_seeds = list(section.get("seeds", [0, 1, 2]))
    seed_list = list(seeds) if seeds is not None else preset_seeds
    runs = runs_of(config, names)
    out = Path(out_dir)
    # The table covers the preset's algorithms and seeds besides those named, read from the
    # folder's finished runs: running one more (algorithm, seed) never drops the others' rows.
    # Rows in the preset's order whichever algorithms a command names (the named ones the
    # preset does not list last): tables written by commands of different names stay alike.
    named = {label for label, _ in runs}
    preset = runs_of(config)
    order = {label: i for i, (label, _) in enumerate(preset)}
    table_runs = sorted(runs + [r for r in preset if r[0] not in named],
                        key=lambda r: order.get(r[0], len(order)))
    table_seeds = sorted({*seed_list, *preset_seeds})
    asked = {(label, int(seed)) for label in named for seed in seed_list}
    measured: dict[str, list[dict[str, float]]] = {label: [] for label, _ in table_runs}
    seeds_of: dict[str, list[int]] = {label: [] for label, _ in table_runs}
    protocols: dict[str, str] = {}   # each run's eval.protocol (a compare entry may set its own)
    planned: list[tuple[str, int, Job]] = []
    absent: list[tuple[str, int, Job]] = []   # not finished yet: another command may finish it
    for seed in table_seeds:
        seeded = cfg.merge(dict(config), {"seed": int(seed)})
        for label, algorithm in table_runs:
            folder = out / label / f"seed-{seed}"
            run_cfg = threads_per_job(run_config_of(seeded, algorithm), jobs)
            protocols[label] = str(run_cfg["eval"]["protocol"])
            wanted = (label, int(seed)) in asked
            if not wanted or finished_only:   # only read back, never run
                if not (folder / "summary.json").exists():
                    absent.append((label, int(seed), Job(run_cfg, folder)))
                    continue
                if not wanted and not same_run(run_cfg, folder):
                    if progress is not None:
                        progress(f"{label} seed {seed}: left out of the table, {folder} "
                                 f"holds a run of another config")
                    continue
            planned.append((label, int(seed), Job(run_cfg, folder)))

    def finished(i: int, summary: dict[str, Any]) -> None:
        label, seed, _ = planned[i]
        if progress is not None:
            f = figures(summary)
            also = "" if math.isnan(f["cluster"]) else f", {f['cluster']:.2f} % (served model)"
            progress(f"{label} seed {seed}: {f['own']:.2f} % ({protocols[label]} "
                     f"protocol){also}, {int(f['clusters'])} clusters, {f['seconds']:.0f} s")

    summaries = run_jobs([job for _, _, job in planned], data_dir, workers=jobs,
                         finished=finished)
    found = {(label, seed): summary
             for (label, seed, _), summary in zip(planned, summaries, strict=True)}
    # Two commands side by side into one folder (each its own algorithm or seed) each write
    # the table as they end: the runs the other one finished meanwhile belong in it too.
    found.update(finished_since(absent))
    for seed in table_seeds:
        for label, _ in table_runs:
            if (label, seed) in found:
                measured[label].append(figures(found[label, seed]))
                seeds_of[label].append(seed)
    result = summarise(config, measured, table_seeds, protocols, seeds_of)
    out.mkdir(parents=True, exist_ok=True)
    if not finished_only:   # the config that ran; a table of finished runs leaves it as it is
        (out / "config.yaml").write_text(cfg.dump(config))
    # Whole files: the command beside this one may be writing the same table.
    save_atomic(out / "reproduce.json", (strict_json.dumps(result, indent=1) + "\n").encode())
    save_atomic(out / "reproduce.md", markdown(result).encode())
    return result


def finished_since(absent: Sequence[tuple[str, int, Job]]
                   ) -> dict[tuple[str, int], dict[str, Any]]:
    """The summaries of the runs among `absent` that have finished since, of the same config."""
    return {(label, seed): json.loads((job.folder / "summary.json").read_text())
            for label, seed, job in absent
            if (job.folder / "summary.json").exists() and same_run(job.config, job.folder)}


def summarise(config: Mapping[str, Any], measured: Mapping[str, Sequence[Mapping[str, float]]],
              seeds: Sequence[int], protocols: Mapping[str, str] | None = None,
              seeds_of: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """The table's rows; `seeds_of` names a row's seeds where it has fewer than `seeds`."""
    section = config.get("reproduce", {})
    paper = {k: paper_figure(k, v) for k, v in dict(section.get("paper", {})).items()}
    protocol = section.get("protocol", "own")
    reasons = dict(section.get("not_comparable", {}) or {})
    rows = []
    for label, runs in measured.items():
        keys = ["own", "cluster", "ari", "clusters", "seconds"]
        if runs and all("shares_error" in r for r in runs):
            keys.append("shares_error")
        stats = {key: mean_std([r[key] for r in runs]) for key in keys}
        row: dict[str, Any] = {"label": label, **stats, "runs": list(runs)}
        if seeds_of is not None and list(seeds_of[label]) != list(seeds):
            row["seeds"] = list(seeds_of[label])
        if protocols and protocols.get(label, config["eval"]["protocol"]) \
                != config["eval"]["protocol"]:
            row["eval_protocol"] = protocols[label]   # the entry's own protocol
        if label in paper:
            row.update(paper=paper[label], verdict=(
                f"not comparable: {reasons[label]}" if label in reasons
                else verdict(paper[label], stats[protocol], len(runs))))
        rows.append(row)
    return {"seeds": list(seeds), "eval_protocol": config["eval"]["protocol"],
            "protocol": protocol, "rows": rows}


def _pm(pair: Sequence[float], digits: int = 2) -> str:
    mean, std = pair
    return "-" if mean != mean else f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown(result: Mapping[str, Any]) -> str:
    """The page's table: the paper's figure, both protocols, clusters and the verdict."""
    # A mixture scenario's runs: the distance of each method's weights from the true shares.
    shares = any("shares_error" in row for row in result["rows"])
    columns = ["algorithm", "paper", "own", "cluster", "ARI", "clusters",
               *(["shares error"] if shares else []), "seconds", "verdict"]
    lines = [f"Seeds {', '.join(str(s) for s in result['seeds'])}; mean ± std in %. `own`: "
             f"the `{result['eval_protocol']}` protocol's figure (each client's own model "
             f"where the protocol is `local`); `cluster`: each client's served model. Every "
             f"verdict compares the paper's figure with our `{result['protocol']}` one: "
             f"within when |ours - paper| <= 2 sqrt(std_paper^2 + std_ours^2), over at least "
             f"3 seeds; a protocol after an algorithm is that run's own (its compare entry's "
             f"eval)." +
             (" `shares error`: the mean total-variation distance between each client's true "
              "source shares and the method's weights on its models (one-hot for a hard "
              "method; 0 is exact)." if shares else ""), "",
             "| " + " | ".join(columns) + " |",
             "| --- |" + " ---: |" * (len(columns) - 2) + " --- |"]
    for row in result["rows"]:
        paper = _pm(row["paper"]) if "paper" in row else ""
        label = row["label"] + (f" (`{row['eval_protocol']}`)" if "eval_protocol" in row
                                else "")
        if "seeds" in row:   # fewer seeds than the table's
            label += (f" (seed{'s' if len(row['seeds']) > 1 else ''} "
                      f"{', '.join(str(s) for s in row['seeds'])})" if row["seeds"]
                      else " (no finished run)")
        error = f"{_pm(row.get('shares_error', (math.nan, 0.0)), 3)} | " if shares else ""
        lines.append(f"| {label} | {paper} | {_pm(row['own'])} | {_pm(row['cluster'])} "
                     f"| {_pm(row['ari'], 3)} | {_pm(row['clusters'], 1)} | {error}"
                     f"{_pm(row['seconds'], 0)} | {row.get('verdict', '')} |")
    return "\n".join(lines) + "\n"
