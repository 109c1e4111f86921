"""`sweep`: one run per point of a grid of config values, and one table of the results.

A config's `sweep` section says what varies (the rest of the config is the base of every run):

    sweep:
      grid:                          # dotted keys -> value lists; every combination is a point
        train.participation: [0.1, 0.2]
        algorithm.rounds_before_clustering: [1, 10]
      cases:                         # optional: sets of values that go together, crossed with
        - {algorithm.metric: l2, algorithm.linkage: ward}    # the grid
        - {algorithm.metric: l1, algorithm.linkage: complete}
      baseline: {algorithm.name: fedavg}   # optional: a reference run per point (runs that
                                           # would be identical are run once); the table gives
                                           # each figure's ratio to it at the same round
      rounds:                        # table columns: label -> "last", a round (1-based), or
        post-cluster: algorithm.rounds_before_clustering+1   # a swept key's value + offset
        last: last
      labels: {train.participation: cf}    # optional column names for swept keys
      best_over: algorithm.threshold       # optional: per group of the other swept values,
                                           # keep the point with the best last-round accuracy

The table reports, per point and per column round, the mean client accuracy and (with
eval.target_accuracy) the share of clients at the target, each with "(ratio x)" to the
baseline, "(-)" where the baseline's figure is 0 (the layout of FL+HC's Tables I-VI).
`best_over` selects on the figures of the runs' `eval.split`: the test data by default, as the
FL+HC paper did (say so where it is used); with `eval.split: validation` (and
`eval.validation_fraction`) on data held out of each client's training set, as a tuning of a
learning rate should (PACFL's Table 12 grid, `pacfl-table12-lr-fmnist`).

Rerunning a sweep into the same folder reads its finished runs back and resumes a cut-off one
from its checkpoint; a folder holding another config (evaluation included: the table reads
its rounds) is refused.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed import strict_json
from clusterfed.errors import ConfigError
from clusterfed.experiments.resumable import IDENTITY_WITH_EVAL, Job, run_jobs, threads_per_job
from clusterfed.run_folder import read_jsonl

SWEEP_KEYS = {"grid", "cases", "baseline", "rounds", "labels", "best_over"}


def patch_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """{'train.lr': 0.1, 'seed': 2} -> {'train': {'lr': 0.1}, 'seed': 2} (a config patch);
    a deeper key sets one entry of a nested mapping, as an override does."""
    patch: dict[str, Any] = {}
    for key, value in values.items():
        parts = str(key).split(".")
        if parts[0] not in cfg.DEFAULTS or not all(parts) or parts[0] == "sweep":
            raise ConfigError(f"sweep key {key!r} must be a config key: section.key (at any "
                              f"depth) or seed")
        if len(parts) == 1:
            patch[parts[0]] = value
        else:
            cfg.set_dotted(patch, parts, value, f"sweep key {key!r}")
    return patch


def check_sweep(sweep: Mapping[str, Any]) -> None:
    unknown = set(sweep) - SWEEP_KEYS
    if unknown:
        raise ConfigError(f"unknown sweep keys {sorted(unknown)}; valid: {sorted(SWEEP_KEYS)}")
    grid = sweep.get("grid", {})
    if not isinstance(grid, Mapping) or not all(
            isinstance(v, list) and v for v in grid.values()):
        raise ConfigError("sweep.grid maps dotted config keys to non-empty value lists")
    cases = sweep.get("cases", [])
    if not isinstance(cases, list) or not all(isinstance(c, Mapping) for c in cases):
        raise ConfigError("sweep.cases is a list of mappings of dotted config keys to values")
    if not grid and not cases:
        raise ConfigError("the config's sweep section has neither grid nor cases: "
                          "nothing to sweep")
    best = sweep.get("best_over")
    if best is not None and best not in grid:
        raise ConfigError(f"sweep.best_over {best!r} must be one of the grid's keys")


def grid_points(sweep: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every point of the sweep: {dotted key: value}, cases (outer) x grid (inner)."""
    check_sweep(sweep)
    grid = dict(sweep.get("grid", {}))
    cases = list(sweep.get("cases", [])) or [{}]
    combos = [dict(zip(grid, values, strict=True)) for values in itertools.product(
        *grid.values())]
    return [{**dict(case), **combo} for case in cases for combo in combos]


def point_configs(config: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(point values, its resolved run config) for each point; each config validated."""
    sweep = config["sweep"]
    base = cfg.merge(dict(config), {})
    base["sweep"] = {}
    return [(point, cfg.resolve(cfg.merge(base, patch_of(point))))
            for point in grid_points(sweep)]


def round_of(rule: Any, point_config: Mapping[str, Any]) -> int:
    """A column's round (1-based) for one point: 'last', a number, or 'section.key+offset'."""
    last = int(point_config["train"]["rounds"])
    if rule == "last":
        return last
    if isinstance(rule, int) and not isinstance(rule, bool):
        return rule
    key, _, offset = str(rule).partition("+")
    section, _, name = key.strip().partition(".")
    try:
        value = point_config[section][name] if name else point_config[section]
        return int(value) + int(offset or 0)
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"sweep.rounds rule {rule!r}: not 'last', a number or "
                          f"'section.key+offset' of the config") from err


def figures_at(records: Sequence[Mapping[str, Any]], rnd: int) -> dict[str, float | None]:
    """Mean accuracy and clients at target of the evaluated record of round `rnd`."""
    for r in records:
        if r.get("round") == rnd and "mean_accuracy" in r:
            return {"mean_accuracy": r["mean_accuracy"],
                    "clients_at_target": r.get("clients_at_target")}
    return {"mean_accuracy": None, "clients_at_target": None}


def run_sweep(config: Mapping[str, Any], out_dir: str | Path, *, data_dir: str | None = None,
              finished_only: bool = False, jobs: int = 1,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every point (and its baseline) into out_dir; write sweep.json and table.md.

    `finished_only`: run nothing; tabulate the points whose runs have finished (a long
    sweep's table so far), listing the others as still to run. `jobs`: runs at a time, each
    in its own process (`run_jobs`). `progress` receives a line as each run starts."""
    out = Path(out_dir)
    sweep = config["sweep"]
    points = point_configs(config)
    split = split_of(points)
    rules = dict(sweep.get("rounds") or {"last": "last"})
    baseline_patch = patch_of(sweep.get("baseline") or {})
    baselines: dict[str, str] = {}     # baseline config -> its folder, numbered in point order
    runs: dict[str, Job] = {}          # folder -> its run, each once, in point order
    what: dict[str, str] = {}          # folder -> the progress line of its start
    baseline_of: list[str | None] = []
    for i, (values, run_cfg) in enumerate(points):
        folder = f"points/{i:03d}"
        runs[folder] = Job(threads_per_job(run_cfg, jobs), out / folder, IDENTITY_WITH_EVAL)
        what[folder] = f"point {i + 1} of {len(points)}: " + " ".join(
            f"{k}={v}" for k, v in values.items())
        base = None
        if baseline_patch:
            base_cfg = cfg.resolve(cfg.merge(run_cfg, baseline_patch))
            base = baselines.setdefault(cfg.dump(base_cfg), f"baselines/{len(baselines):03d}")
            if base not in runs:
                runs[base] = Job(threads_per_job(base_cfg, jobs), out / base,
                                 IDENTITY_WITH_EVAL)
                what[base] = f"baseline {base.split('/')[1]} (point {i + 1})"
        baseline_of.append(base)
    out.mkdir(parents=True, exist_ok=True)
    folders = [f for f in runs if not finished_only or (out / f / "summary.json").exists()]
    run_jobs([runs[f] for f in folders], data_dir, workers=jobs,
             started=None if progress is None else lambda i: progress(what[folders[i]]))
    records_of = {f: read_jsonl(out / f / "metrics.jsonl") for f in folders}

    rows, missing = [], []
    for i, (values, run_cfg) in enumerate(points):
        row: dict[str, Any] = {"values": values, "run": f"points/{i:03d}"}
        point_records = records_of.get(row["run"])
        if point_records is None:
            missing.append(values)
            continue
        base_records = None
        if baseline_of[i] is not None:
            row["baseline"] = baseline_of[i]
            base_records = records_of.get(baseline_of[i])
        row["columns"] = {}
        for label, rule in rules.items():
            rnd = round_of(rule, run_cfg)
            cell: dict[str, Any] = {"round": rnd, **figures_at(point_records, rnd)}
            if base_records is not None:
                cell["baseline"] = figures_at(base_records, rnd)
            row["columns"][label] = cell
        rows.append(row)
    result = {"grid": [p for p, _ in points], "rows": rows, "rounds": rules,
              "labels": dict(sweep.get("labels") or {}), "best_over": sweep.get("best_over"),
              "split": split, "missing": missing}
    if not finished_only:   # the config that ran; a table of finished runs leaves it as it is
        (out / "config.yaml").write_text(cfg.dump(config))
    (out / "sweep.json").write_text(strict_json.dumps(result, indent=1, default=str) + "\n")
    (out / "table.md").write_text(format_sweep_table(result) + "\n")
    return result


def split_of(points: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> str:
    """The one `eval.split` every point is scored on; a sweep that mixes them is refused
    (its best_over would compare test with validation figures)."""
    splits = {run_cfg["eval"]["split"] for _, run_cfg in points}
    if len(splits) > 1:
        raise ConfigError(f"a sweep's points are scored on one eval.split; got {sorted(splits)}")
    return splits.pop() if splits else "test"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None:
        return ""
    if base == 0:
        return " (-)"
    return f" ({value / base:.1f}x)"


def _cell(cell: Mapping[str, Any], key: str) -> str:
    value = cell.get(key)
    if value is None:
        return "n/a"
    base = cell.get("baseline", {}).get(key) if "baseline" in cell else None
    return f"{100 * value:.1f}" + _ratio(value, base)


def best_rows(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The rows to tabulate: all, or per group the best by the last column's accuracy."""
    rows = list(result["rows"])
    best = result.get("best_over")
    if not best:
        return rows
    last = list(result["rounds"])[-1]
    groups: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        key = json.dumps({k: v for k, v in row["values"].items() if k != best},
                         sort_keys=True, default=str)
        acc = row["columns"][last]["mean_accuracy"] or 0.0
        if key not in groups or acc > (groups[key]["columns"][last]["mean_accuracy"] or 0.0):
            groups[key] = row
    return list(groups.values())


def format_sweep_table(result: Mapping[str, Any]) -> str:
    """A markdown table in the layout of FL+HC's Tables I-VI."""
    rows = best_rows(result)
    # Every swept key of any row (cases may set keys the others do not: FedProx's mu).
    keys = list(dict.fromkeys(k for row in rows for k in row["values"]))
    labels = result.get("labels") or {}
    columns = list(result["rounds"])
    has_target = any(row["columns"][c].get("clients_at_target") is not None
                     for row in rows for c in columns)
    head = [labels.get(k, k.split(".")[-1]) for k in keys]
    split = result.get("split", "test")
    head += [f"{split} acc {c}" for c in columns]
    if has_target:
        head += [f"% clients at target {c}" for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(row["values"].get(k, "")) for k in keys]
        cells += [_cell(row["columns"][c], "mean_accuracy") for c in columns]
        if has_target:
            cells += [_cell(row["columns"][c], "clients_at_target") for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    note = ("Figures in %; in brackets the ratio to the baseline run at the same round, "
            "(-) where the baseline's figure is 0.")
    if result.get("best_over"):
        note += (f" Each row is the best {result['best_over']} by the last column's {split} "
                 f"accuracy" + (" (selection on test data, as in the paper)." if split == "test"
                                else " (selection on held-out training data, not test)."))
    if any("baseline" in row and not all("baseline" in cell for cell in row["columns"].values())
           for row in rows):
        note += " A row without ratios: its baseline run has not finished."
    if result.get("missing"):
        note += " Not finished yet: " + "; ".join(
            " ".join(f"{k}={v}" for k, v in values.items()) for values in result["missing"]) + "."
    return "\n".join([*lines, "", note])
