"""FL+HC Tables IV/V from one run: every metric x linkage x tau cut from one clustering round.

The clustering depends only on the clustering round's updates (Algorithm 1, lines 6-12), so one
run that records every metric's distances there (`record_distances`) gives the partition of all
ten pairings (Ward with L2 only) at every tau without training them. Only the distinct
partitions need their post-clustering rounds: each is rerun with `algorithm.partition`, which
continues exactly as a run that found it (tests/test_flhc.py). The paper keeps each pairing's
best tau by round-50 test accuracy (selection on test data; said so in the table).

    python -m clusterfed.experiments.flhc_pairings PRESET [key=value ...] --out DIR
        [--data-dir D] [--train] [--baseline] [--finished | --clustering]

`--clustering` reads the cuts from a probe that is past its clustering round, finished or not
(a cut-off probe's clustering is known long before its accuracies).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clusterfed import config as cfg
from clusterfed.clustering import hierarchical as hc
from clusterfed.clustering.metrics import clustering_scores, has_truth
from clusterfed.clustering.precomputed import first_appearance_labels
from clusterfed.errors import ConfigError
from clusterfed.experiments.parallel import LatestFederation
from clusterfed.experiments.resumable import Job, run_jobs, run_or_resume, threads_per_job
from clusterfed.experiments.sweep import figures_at, round_of
from clusterfed.run_folder import read_jsonl
from clusterfed.sim.simulation import build_federation_for

PAIRINGS = tuple((m, link) for m in ("cosine", "l2", "l1")
                 for link in ("average", "complete", "single", "ward")
                 if link != "ward" or m == "l2")
# flhc-grid-b's scale-free taus: multiples of each tree's median merge height.
MEDIAN_TAUS = (1.25, 1.5, 2.0, 3.0, 4.0, 6.0)


def cut_all(distances: Mapping[str, Sequence[float]], taus: Sequence[float] = MEDIAN_TAUS,
            mode: str = "median") -> list[dict[str, Any]]:
    """Every pairing's partition at every tau, from condensed distances per metric."""
    rows = []
    for metric, linkage in PAIRINGS:
        condensed = np.asarray(distances[metric], dtype=np.float64)
        for tau in taus:
            tree = hc.cluster_condensed(condensed, linkage, float(tau), mode)
            rows.append({"metric": metric, "linkage": linkage, "tau": float(tau), "mode": mode,
                         "cut_height": float(tree.threshold),
                         "labels": first_appearance_labels(tree.labels).tolist(),
                         "n_clusters": int(tree.num_clusters)})
    return rows


def scored_cuts(distances: Mapping[str, Sequence[float]], truth: Any,
                taus: Sequence[float] = MEDIAN_TAUS, mode: str = "median"
                ) -> list[dict[str, Any]]:
    """`cut_all`'s rows, each with its ARI against `truth` (None without a truth)."""
    rows = cut_all(distances, taus, mode)
    for row in rows:
        row["ari"] = (clustering_scores(truth, np.asarray(row["labels"]))["ari"]
                      if has_truth(truth) else None)
    return rows


def best_cuts(distances: Mapping[str, Sequence[float]], truth: np.ndarray,
              k_max: int = 10) -> list[dict[str, Any]]:
    """Per pairing, the cut of its tree into 1..k_max clusters that best matches `truth` (ARI)
    and the taus, as multiples of the median merge height, that make that cut: whether any tau
    could have found the truth, whatever grid of taus is tried."""
    out = []
    for metric, linkage in PAIRINGS:
        condensed = np.asarray(distances[metric], dtype=np.float64)
        best: dict[str, Any] | None = None
        for k in range(1, k_max + 1):
            tree = hc.cluster_condensed(condensed, linkage, float(k), "clusters")
            ari = float(clustering_scores(truth, tree.labels)["ari"])
            # Fewer clusters win unless more match the truth by over 0.001 ARI.
            if best is None or ari > best["ari"] + 1e-3:
                heights = np.sort(tree.heights)
                n = len(heights) + 1
                clusters = int(tree.num_clusters)
                # k clusters: above the (n - k)-th merge, below the next one.
                low = heights[n - clusters - 1] if clusters < n else 0.0
                high = heights[n - clusters] if clusters > 1 else float("inf")
                median = float(np.median(heights))
                best = {"metric": metric, "linkage": linkage, "n_clusters": clusters,
                        "ari": ari, "labels": first_appearance_labels(tree.labels).tolist(),
                        "tau_range": [float(low / median), float(high / median)]}
        assert best is not None
        out.append(best)
    return out


def distinct_partitions(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, ...]]:
    """The different partitions among the rows, in order of first appearance."""
    seen: dict[tuple[int, ...], None] = {}
    for row in rows:
        seen.setdefault(tuple(row["labels"]), None)
    return list(seen)


def clustering_event(folder: Path) -> dict[str, Any]:
    for event in read_jsonl(folder / "events.jsonl"):
        if event.get("type") == "hierarchical_clustering" and "distances" in event:
            return event
    raise ValueError(f"{folder}/events.jsonl has no clustering round with recorded distances")


def best_rows(rows: Sequence[Mapping[str, Any]], column: str = "r50"
              ) -> list[Mapping[str, Any]]:
    """Per pairing, the tau with the best mean accuracy in `column` (the paper's selection)."""
    out = []
    for metric, linkage in PAIRINGS:
        mine = [r for r in rows if r["metric"] == metric and r["linkage"] == linkage
                and r.get(column, {}).get("mean_accuracy") is not None]
        if mine:
            out.append(max(mine, key=lambda r: r[column]["mean_accuracy"]))
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def markdown(result: Mapping[str, Any]) -> str:
    rows = result["rows"]
    lines = [f"Clustering round of `{result['probe']}`: all {len(PAIRINGS)} pairings x "
             f"{len(result['taus'])} taus ({result['mode']} mode) cut from its recorded "
             f"distances; {len(result['partitions'])} distinct partitions.", "",
             "| metric | linkage | tau | cut height | clusters | ARI |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        ari = "-" if r.get("ari") is None else f"{r['ari']:.3f}"
        lines.append(f"| {r['metric']} | {r['linkage']} | {r['tau']:g} | {r['cut_height']:.4g} "
                     f"| {r['n_clusters']} | {ari} |")
    best = best_rows(rows)
    if best:
        base = result.get("baseline") or {}
        # The "r50" key is the paper's last round (50); a shorter run's last round is named.
        last = f"r{result.get('columns', {}).get('r50', 50)}"
        lines += ["", f"Best tau per pairing by round-{last[1:]} test accuracy (the paper's "
                  "selection, on test data). Accuracy in %; clients at target in %.", "",
                  f"| metric | linkage | tau | clusters | ARI | acc post-cluster | acc {last} | "
                  f"at target post-cluster | at target {last} |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in best:
            ari = "-" if r.get("ari") is None else f"{r['ari']:.3f}"
            pc, last = r["post-cluster"], r["r50"]
            lines.append(f"| {r['metric']} | {r['linkage']} | {r['tau']:g} | {r['n_clusters']} "
                         f"| {ari} | {_pct(pc['mean_accuracy'])} | {_pct(last['mean_accuracy'])} "
                         f"| {_pct(pc['clients_at_target'])} | {_pct(last['clients_at_target'])} |")
        if base:
            lines.append(f"| FedAvg | | | 1 | | {_pct(base['post-cluster']['mean_accuracy'])} | "
                         f"{_pct(base['r50']['mean_accuracy'])} | "
                         f"{_pct(base['post-cluster']['clients_at_target'])} | "
                         f"{_pct(base['r50']['clients_at_target'])} |")
    cuts = result.get("best_cuts")
    if cuts:
        last = f"r{result.get('columns', {}).get('r50', 50)}"
        lines += ["", "Any cut of each tree: the number of clusters (up to 10) whose cut best "
                  "matches the truth, and the taus (x the median merge height) that make it; "
                  "accuracy where that partition was trained.", "",
                  f"| metric | linkage | clusters | ARI | taus (x median) | acc {last} |",
                  "| --- | --- | ---: | ---: | --- | ---: |"]
        for c in cuts:
            low, high = c["tau_range"]
            acc = _pct(c["r50"]["mean_accuracy"]) if c.get("r50") else "-"
            lines.append(f"| {c['metric']} | {c['linkage']} | {c['n_clusters']} | "
                         f"{c['ari']:.3f} | {low:.3g} to {high:.3g} | {acc} |")
    return "\n".join(lines)


def run_pairings(config: Mapping[str, Any], out_dir: str | Path, *, data_dir: str | None = None,
                 train: bool = False, baseline: bool = False,
                 taus: Sequence[float] = MEDIAN_TAUS, mode: str = "median",
                 finished_only: bool = False, jobs: int = 1) -> dict[str, Any]:
    """The probe run, every pairing's cut, and (with `train`) each distinct partition's run.
    `finished_only`: run nothing, read back the runs finished so far (the probe must be).
    `jobs`: partition and baseline runs at a time, each in its own process (`run_jobs`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = _flhc(config)
    federation = build_federation_for(config, data_dir)
    probe_cfg = cfg.resolve(cfg.merge(config, {"algorithm": {"record_distances": True}}))
    if finished_only and not (out / "probe" / "summary.json").exists():
        raise ConfigError(f"{out / 'probe'} has not finished: nothing to read back")
    run_or_resume(probe_cfg, out / "probe", federation, data_dir)
    result = clustering_result(out / "probe", federation.true_clusters, taus, mode)
    rows = result["rows"]
    partitions = [tuple(p) for p in result["partitions"]]
    columns = {"post-cluster": round_of("algorithm.rounds_before_clustering+1", config),
               "r50": round_of("last", config)}
    result["columns"] = columns
    records: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    records[tuple(result["preset_cut"]["labels"])] = read_jsonl(out / "probe" / "metrics.jsonl")
    after: list[tuple[tuple[int, ...] | None, Job]] = []   # (partition or None: baseline, run)
    if train or finished_only:
        for i, labels in enumerate(partitions):
            if labels in records:
                continue
            run_cfg = cfg.resolve(cfg.merge(config, {"algorithm": {"partition": list(labels)}}))
            folder = out / "partitions" / f"{i:03d}"
            if finished_only and not (folder / "summary.json").exists():
                continue
            after.append((labels, Job(threads_per_job(run_cfg, jobs), folder)))
    if baseline and not (finished_only and not (out / "baseline" / "summary.json").exists()):
        base_cfg = cfg.resolve(cfg.merge(config, {"algorithm": {"name": "fedavg"}}))
        after.append((None, Job(threads_per_job(base_cfg, jobs), out / "baseline")))

    def started(k: int) -> None:
        labels, job = after[k]
        what = "FedAvg" if labels is None else f"{max(labels) + 1} clusters"
        print(f"run {k + 1}/{len(after)}: {what} -> {job.folder}", flush=True)

    probe_federation = LatestFederation()   # run here, the partitions reuse the probe's
    probe_federation.hold(config, federation)
    run_jobs([job for _, job in after], data_dir, workers=jobs, started=started,
             federations=probe_federation)
    base = None
    for labels, job in after:
        if labels is None:
            base = read_jsonl(job.folder / "metrics.jsonl")
        else:
            records[labels] = read_jsonl(job.folder / "metrics.jsonl")
    for row in rows:
        got = records.get(tuple(row["labels"]))
        if got is not None:
            for label, rnd in columns.items():
                row[label] = figures_at(got, rnd)
    for cut in result.get("best_cuts", []):
        got = records.get(tuple(cut["labels"]))
        if got is not None:
            cut["r50"] = figures_at(got, columns["r50"])
    if base is not None:
        result["baseline"] = {label: figures_at(base, rnd) for label, rnd in columns.items()}
    (out / "pairings.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "table.md").write_text(markdown(result) + "\n")
    return result


def clustering_result(probe: Path, truth: Any, taus: Sequence[float], mode: str,
                      event: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The part of a pairings result read from the probe's clustering round alone: every
    cut scored, the distinct partitions, the preset's own cut and (with a truth) each tree's
    best cut. `event`: the clustering event, when already read."""
    event = clustering_event(probe) if event is None else event
    rows = scored_cuts(event["distances"], truth, taus, mode)
    result: dict[str, Any] = {
        "probe": str(probe), "taus": list(taus), "mode": mode, "rows": rows,
        "partitions": [list(p) for p in distinct_partitions(rows)],
        "preset_cut": {"metric": event["metric"], "linkage": event["linkage"],
                       "labels": first_appearance_labels(np.asarray(event["labels"])).tolist()}}
    if has_truth(truth):
        result["best_cuts"] = best_cuts(event["distances"], np.asarray(truth))
    return result


def _flhc(config: Mapping[str, Any]) -> dict[str, Any]:
    config = cfg.resolve(config)
    if config["algorithm"]["name"] != "flhc":
        raise ValueError("flhc_pairings runs an FL+HC preset (algorithm.name: flhc)")
    return config


def read_clustering(config: Mapping[str, Any], out_dir: str | Path, *,
                    data_dir: str | None = None, taus: Sequence[float] = MEDIAN_TAUS,
                    mode: str = "median") -> dict[str, Any]:
    """Run nothing: every pairing's cut from the probe's clustering round, whether or not the
    probe has finished; written to clustering.json / clustering.md (table.md is left alone)."""
    out = Path(out_dir)
    config = _flhc(config)
    probe = out / "probe"
    if not (probe / "events.jsonl").exists():
        raise ConfigError(f"{probe} has no run: start it without --clustering first")
    try:
        event = clustering_event(probe)
    except ValueError:
        rounds = config["algorithm"]["rounds_before_clustering"]
        raise ConfigError(f"{probe} has not reached its clustering round (after round "
                          f"{rounds}): nothing to read yet") from None
    result = clustering_result(probe, build_federation_for(config, data_dir).true_clusters,
                               taus, mode, event)
    (out / "clustering.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "clustering.md").write_text(markdown(result) + "\n")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", required=True)
    parser.add_argument("--data-dir")
    parser.add_argument("--train", action="store_true",
                        help="also run every distinct partition to the last round")
    parser.add_argument("--baseline", action="store_true", help="also run FedAvg")
    parser.add_argument("--finished", action="store_true",
                        help="run nothing: the tables of the runs finished so far")
    parser.add_argument("--clustering", action="store_true",
                        help="run nothing: every pairing's cut from the probe's clustering "
                             "round, finished or not")
    parser.add_argument("--jobs", type=int, default=1,
                        help="partition runs at a time, each in its own process")
    args = parser.parse_args(argv)
    config = cfg.resolve(args.source, args.overrides)
    if args.clustering:
        if args.train or args.baseline or args.finished:
            parser.error("--clustering runs nothing: not with --train, --baseline, --finished")
        print(markdown(read_clustering(config, args.out, data_dir=args.data_dir)))
        return
    result = run_pairings(config, args.out, data_dir=args.data_dir, train=args.train,
                          baseline=args.baseline, finished_only=args.finished, jobs=args.jobs)
    print(markdown(result))


if __name__ == "__main__":
    main()
