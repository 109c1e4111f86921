"""The command line: clusterfed run | compare | sweep | presets | scenario describe | export |
secret new | flower local | report."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from clusterfed import config as cfg
from clusterfed.errors import ClusterfedError


def _out_dir(out: str | None, name: str, label: str) -> Path:
    """The output folder, checked before anything is built: an --out that cannot be one is
    refused at once."""
    from clusterfed.run_folder import check_out_folder

    folder = (Path(out) if out
              else Path("runs") / f"{name}-{label}-{time.strftime('%Y%m%d-%H%M%S')}")
    check_out_folder(folder)
    return folder


def _resolve(source: str, overrides: Sequence[str], data_dir: str | None) -> tuple[str, dict]:
    name, raw = cfg.load_source(source)
    extra = [f"data.root={data_dir}"] if data_dir else []
    return name, cfg.resolve(raw, [*overrides, *extra])


def _refuse_cut_off(folder: Path, overwrite: bool, command: str) -> None:
    """Starting over deletes a cut-off run's checkpoint (hours of rounds, perhaps): only on
    --overwrite."""
    from clusterfed.run_folder import checkpoint_files, refuse_busy

    refuse_busy(folder)
    if checkpoint_files(folder) and not (folder / "summary.json").exists() \
            and not overwrite:
        raise ClusterfedError(f"{folder} holds a run cut off before its end: continue it with "
                              f"`{command} --resume {folder}`, or start over with --overwrite")


def _resumable(resume_dir: str, source: str | None, overrides: Sequence[str]) -> Path:
    """A folder --resume can continue, checked before anything is built: its config, a
    checkpoint that reads whole (or none), no other process writing it."""
    from clusterfed.run_folder import read_config, readable_checkpoint, refuse_busy

    if source or overrides:
        raise ClusterfedError("--resume continues a run with its own config.yaml; "
                              "give no preset or overrides")
    folder = Path(resume_dir)
    if not folder.is_dir():
        raise ClusterfedError(f"--resume {folder}: no such run folder")
    read_config(folder)
    refuse_busy(folder)
    readable_checkpoint(folder)
    return folder


def _precheck(config: dict[str, Any]) -> None:
    """What can be checked before torch is imported (seconds): the algorithm's name and
    options, the privacy secret file."""
    from clusterfed.algorithms import build_algorithm
    from clusterfed.client.secret import read_secret_file

    build_algorithm(config["algorithm"], config["newcomers"])
    if config["run"]["privacy"] != "none" and config["run"]["privacy_secret_file"]:
        read_secret_file(config["run"]["privacy_secret_file"])   # as the run would read it


def result_line(summary: dict[str, Any]) -> str:
    """The one line a finished run prints: accuracy, clusters, ARI (n/a without a truth)."""
    from clusterfed.clustering.metrics import score_text

    c = summary["clustering"]
    ari = "n/a (no truth)" if c.get("ari") is None else f"{c['ari']:.3f}"
    # Further true groupings (a corruption, noisy labels): their ARI after the clusters'.
    also = "".join(f", ARI vs {name} {score_text(g['ari'])}"
                   for name, g in c.get("groupings", {}).items())
    news = summary["final"].get("newcomers")
    late = f" (newcomers {news['mean_accuracy']:.4f})" if news else ""
    missing = summary["final"].get("unevaluated_clients")
    unscored = f", clients not evaluated: {', '.join(map(str, missing))}" if missing else ""
    return (f"{summary['algorithm']}: mean accuracy "
            f"{score_text(summary['final']['mean_accuracy'], 4)}{late}, {c['n_clusters']} "
            f"clusters, ARI {ari}{also}{unscored}, {summary['wall_seconds']:.1f} s")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log more.")
def main(verbose: bool) -> None:
    """Clustered federated learning: run, compare and report the papers' methods."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s: %(message)s")
    # A journalled step's chunks (hours of LCFL's exchange at scale) are its only progress.
    logging.getLogger("clusterfed.journal").setLevel(logging.INFO)


@main.command()
@click.argument("source", required=False)
@click.argument("overrides", nargs=-1)
@click.option("--out", help="Run folder (default runs/NAME-ALGORITHM-TIME).")
@click.option("--data-dir", help="Data root (default $CLUSTERFED_DATA or the user cache).")
@click.option("--resume", "resume_dir", help="Continue this run folder from its checkpoint.")
@click.option("--overwrite", is_flag=True, help="Start over in an --out that holds a run cut "
              "off before its end (refused without it: --resume continues that run).")
def run(source: str | None, overrides: tuple[str, ...], out: str | None, data_dir: str | None,
        resume_dir: str | None, overwrite: bool) -> None:
    """Run PRESET or CONFIG.yaml with key=value overrides, or --resume a run folder."""
    # One line: the executor and threads the run uses (sim.choice's logger; named here so
    # that a bad argument is answered before torch is imported).
    logging.getLogger("clusterfed.executor").setLevel(logging.INFO)
    if resume_dir:
        folder = _resumable(resume_dir, source, overrides)
        from clusterfed.sim.simulation import resume_run

        summary = resume_run(folder, data_dir=data_dir)
    else:
        if not source:
            raise ClusterfedError("give a preset name or a config file (see `clusterfed presets`)")
        name, config = _resolve(source, overrides, data_dir)
        folder = _out_dir(out, name, config["algorithm"]["name"])
        _refuse_cut_off(folder, overwrite, "clusterfed run")
        _precheck(config)
        from clusterfed.sim.simulation import run_config

        try:
            summary = run_config(config, folder)
        except KeyboardInterrupt:
            click.echo(f"interrupted; continue from the last checkpoint with: "
                       f"clusterfed run --resume {folder}", err=True)
            raise
    from clusterfed.report import write_report

    write_report(folder)
    click.echo(result_line(summary))
    click.echo(f"run folder: {folder}")


# Several runs at a time, each in its own process with its share of the cores.
JOBS = click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
                    help="Runs at a time, each in its own process; a run that sets no "
                    "run.threads gets cores / jobs threads.")


@main.command()
@click.argument("source")
@click.argument("overrides", nargs=-1)
@click.option("--algorithms", help="Comma-separated names (default: the preset's list).")
@click.option("--out", help="Comparison folder (default runs/NAME-compare-TIME).")
@click.option("--data-dir", help="Data root (default $CLUSTERFED_DATA or the user cache).")
@JOBS
def compare(source: str, overrides: tuple[str, ...], algorithms: str | None, out: str | None,
            data_dir: str | None, jobs: int) -> None:
    """Run several algorithms on the same federation and tabulate them."""
    from clusterfed.experiments.compare import compare as run_compare
    from clusterfed.experiments.compare import labelled_sections
    from clusterfed.report import write_report
    from clusterfed.report.tables import format_table, table_rows

    name, config = _resolve(source, overrides, data_dir)
    folder = _out_dir(out, name, "compare")
    names = [a.strip() for a in algorithms.split(",") if a.strip()] if algorithms else None
    labels = [label for label, _ in labelled_sections(config, names)]
    reused = [label for label in labels if (folder / label / "summary.json").exists()]
    comparison = run_compare(config, folder, names, jobs=jobs)
    write_report(folder)
    click.echo(format_table(table_rows(comparison)))
    if reused:
        click.echo(f"reused {len(reused)} of {len(labels)} finished runs already in {folder} "
                   f"({', '.join(reused)}); delete them or give another --out to run them "
                   f"again")
    click.echo(f"report: {folder / 'report.md'}")


@main.command()
@click.argument("source")
@click.argument("overrides", nargs=-1)
@click.option("--out", help="Sweep folder (default runs/NAME-sweep-TIME); rerunning into it "
              "keeps finished runs and resumes cut-off ones.")
@click.option("--data-dir", help="Data root (default $CLUSTERFED_DATA or the user cache).")
@click.option("--list", "list_only", is_flag=True, help="Print the grid's points; run nothing.")
@click.option("--finished", "finished_only", is_flag=True,
              help="Run nothing: tabulate the points finished so far in --out.")
@JOBS
def sweep(source: str, overrides: tuple[str, ...], out: str | None, data_dir: str | None,
          list_only: bool, finished_only: bool, jobs: int) -> None:
    """Run one config per point of its `sweep` grid and tabulate them (the overrides apply to
    every point). Rerun into the same --out, a sweep continues where it was cut off."""
    from clusterfed.experiments.sweep import format_sweep_table, point_configs, run_sweep

    name, config = _resolve(source, overrides, data_dir)
    points = point_configs(config)
    if list_only:
        for i, (values, _) in enumerate(points):
            click.echo(f"{i:03d} " + " ".join(f"{k}={v}" for k, v in values.items()))
        return
    if finished_only and out is None:
        raise click.UsageError("--finished reads a sweep folder: give its --out")
    folder = _out_dir(out, name, "sweep")
    result = run_sweep(config, folder, finished_only=finished_only, jobs=jobs,
                       progress=lambda line: click.echo(line, err=True))
    click.echo(format_sweep_table(result))
    click.echo(f"table: {folder / 'table.md'}")


@main.command()
@click.argument("source")
@click.argument("overrides", nargs=-1)
@click.option("--algorithms", help="Comma-separated labels (default: the preset's "
              "reproduce.algorithms, else its compare list).")
@click.option("--seeds", help="Comma-separated seeds (default: reproduce.seeds, else 0,1,2).")
@click.option("--out", help="Folder (default runs/reproduce-NAME); rerunning into it keeps "
              "finished runs and resumes cut-off ones. Its table covers the preset's "
              "algorithms and seeds besides those named, from the runs finished there.")
@click.option("--data-dir", help="Data root (default $CLUSTERFED_DATA or the user cache).")
@click.option("--finished", is_flag=True, help="Run nothing: write the table of the runs "
              "finished so far, each row with its seeds.")
@JOBS
def reproduce(source: str, overrides: tuple[str, ...], algorithms: str | None,
              seeds: str | None, out: str | None, data_dir: str | None, finished: bool,
              jobs: int) -> None:
    """Run a paper preset over its seeds: mean ± std beside the paper's figures, a verdict."""
    from clusterfed.experiments import reproduce as rep

    name, config = _resolve(source, overrides, data_dir)
    seed_list = _seeds(seeds, []) or None
    folder = _out_dir(out or f"runs/reproduce-{name}", name, "reproduce")
    result = rep.reproduce(config, folder, names=_names(algorithms, []) or None,
                           seeds=seed_list, data_dir=data_dir,
                           progress=lambda line: click.echo(line, err=True),
                           finished_only=finished, jobs=jobs)
    click.echo(rep.markdown(result), nl=False)
    click.echo(f"table: {folder / 'reproduce.md'}")


def _names(option: str | None, default: Sequence[Any]) -> list[Any]:
    return [a.strip() for a in option.split(",") if a.strip()] if option else list(default)


def _seeds(option: str | None, default: Sequence[int]) -> list[int]:
    try:
        return [int(s) for s in _names(option, default)]
    except ValueError as err:
        raise ClusterfedError(f"--seeds takes whole numbers: {option}") from err


@main.command()
@click.argument("overrides", nargs=-1)
@click.option("--quick", is_flag=True, help="The quick matrix: digits, four scenarios (label "
              "swap, unequal rotations, label groups, iid), the clustered methods, 3 seeds "
              "(minutes on 2 cores); the same as --tier quick.")
@click.option("--tier", type=click.Choice(["quick", "full", "realistic", "realistic-ci"]),
              help="The matrix (default full): quick (digits, minutes); full (the papers' "
              "federations of 20 clients); realistic (100 clients, 10-30 % a round, unequal "
              "clusters, label skew inside them, uneven sizes: days on 2 cores); "
              "realistic-ci (its CI slice).")
@click.option("--datasets", help="Comma-separated datasets (digits, mnist, fashion_mnist).")
@click.option("--scenarios", help="Comma-separated scenarios (default: all, or the quick ones).")
@click.option("--methods", help="Comma-separated algorithms (default: the clustered methods "
              "with FedAvg and Local; --quick: the clustered methods).")
@click.option("--seeds", help="Comma-separated seeds (default 0,1,2).")
@click.option("--out", help="Folder (default runs/benchmark or runs/benchmark-quick); an "
              "existing one resumes: finished cells are kept.")
@click.option("--data-dir", help="Data root (default $CLUSTERFED_DATA or the user cache).")
@click.option("--check", is_flag=True, help="Exit 1 if a method misses a claim.")
@JOBS
def benchmark(overrides: tuple[str, ...], quick: bool, tier: str | None, datasets: str | None,
              scenarios: str | None, methods: str | None, seeds: str | None, out: str | None,
              data_dir: str | None, check: bool, jobs: int) -> None:
    """Methods x scenarios x seeds with every method at its defaults: ARI, clusters, accuracy.

    OVERRIDES (key=value) apply to every cell, e.g. run.threads=1."""
    from clusterfed.experiments import benchmark as bench

    if quick and tier not in (None, "quick"):
        raise ClusterfedError(f"--quick is --tier quick; it cannot go with --tier {tier}")
    tier = "quick" if quick else tier
    matrix = bench.TIERS[tier or "full"]
    folder = _out_dir(out or (f"runs/benchmark-{tier}" if tier else "runs/benchmark"), "", "")
    seed_list = _seeds(seeds, matrix["seeds"])
    rows = bench.run_benchmark(
        folder, datasets=_names(datasets, matrix["datasets"]),
        scenarios=_names(scenarios, matrix["scenarios"]),
        methods=_names(methods, matrix["methods"]), seeds=seed_list, overrides=overrides,
        data_dir=data_dir, progress=lambda line: click.echo(line, err=True), jobs=jobs)
    given = [("--quick", quick), ("--tier", None if quick else tier),
             ("--datasets", datasets), ("--scenarios", scenarios), ("--methods", methods),
             ("--seeds", seeds)]
    command = " ".join(["clusterfed benchmark", *overrides,
                        *(f"{flag} {value}" if value is not True else flag
                          for flag, value in given if value)])
    summary = bench.write_outputs(folder, rows, command)
    click.echo(bench.markdown(summary), nl=False)
    missed = bench.failures(summary)
    click.echo(f"table: {folder / 'benchmark.md'}; claims missed: "
               f"{', '.join(missed) if missed else 'none'}")
    if check and missed:
        sys.exit(1)


@main.command()
def presets() -> None:
    """List the presets."""
    for name, path in sorted(cfg.preset_paths().items()):
        click.echo(f"{name:29s} {preset_summary(path.read_text())}")


def preset_summary(text: str, width: int = 160) -> str:
    """A preset file's leading comment up to its first full stop outside parentheses; past
    `width`, cut at the last comma, colon or semicolon outside parentheses (then "..."): a
    description never cut mid-parenthesis."""
    words = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("# ").split()
    comment, depth, cut = " ".join(words), 0, 0
    for i, char in enumerate(comment):
        depth += {"(": 1, ")": -1}.get(char, 0)
        ends = i + 1 == len(comment) or comment[i + 1] == " "
        if depth or not ends or char not in ".,:;":
            continue
        if char == "." and not comment[:i].endswith(("e.g", "i.e", "al", "vs", "Fig")):
            return comment[:i + 1] if i < width or not cut else comment[:cut] + " ..."
        if char != "." and i < width:
            cut = i
    return comment if len(comment) <= width or not cut else comment[:cut] + " ..."


@main.group()
def scenario() -> None:
    """Look at the federation a config's scenario builds, or write it as client folders."""


@scenario.command()
@click.argument("source")
@click.argument("overrides", nargs=-1)
@click.option("--data-dir", help="Data root (default $CLUSTERFED_DATA or the user cache).")
@click.option("--out", help="Folder for the plots and scenario.json (default runs/scenario-NAME).")
def describe(source: str, overrides: tuple[str, ...], data_dir: str | None,
             out: str | None) -> None:
    """Build PRESET or CONFIG.yaml's federation; print and plot its clusters, sizes, labels."""
    from clusterfed import strict_json
    from clusterfed.data.describe import describe as describe_federation
    from clusterfed.data.describe import format_description
    from clusterfed.report.scenario_plots import write_scenario_plots
    from clusterfed.run_folder import make_folder
    from clusterfed.sim.simulation import build_federation_for

    name, config = _resolve(source, overrides, data_dir)
    folder = _out_dir(out or f"runs/scenario-{name}", name, "")
    federation = build_federation_for(config)
    description = describe_federation(federation)
    make_folder(folder)
    (folder / "scenario.json").write_text(strict_json.dumps(
        {"data": config["data"], "scenario": config["scenario"], "seed": config["seed"],
         **description}, indent=1, default=str))
    write_scenario_plots(description, folder)
    where = (f"own data in {config['data']['root']}" if description["true_clusters"] is None
             else f"scenario {config['scenario']['kind']} on {config['data']['dataset']}")
    click.echo(f"{where}: " + format_description(description))
    click.echo(f"plots and scenario.json: {folder}")


@scenario.command("export")
@click.argument("source")
@click.argument("directory", metavar="DIR")
@click.argument("overrides", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(["npz", "images", "csv"]), default="npz",
              show_default=True, help="npz: x_train, y_train, x_test, y_test (float32, exact); "
              "images: PNG per class folder under train/ and test/ (8-bit inputs only); "
              "csv: train.csv and test.csv, a column per input value and `label`.")
@click.option("--data-dir", help="Data root (default $CLUSTERFED_DATA or the user cache).")
@click.option("--force", is_flag=True, help="Write into a non-empty DIR, replacing its "
              "client-K folders and truth.json.")
def export(source: str, directory: str, overrides: tuple[str, ...], fmt: str,
           data_dir: str | None, force: bool) -> None:
    """Write PRESET or CONFIG.yaml's federation as DIR/client-K/ folders of own data.

    The federation is built exactly as `clusterfed run` builds it; `clusterfed run ...
    data.dataset=folders data.root=DIR` (or Flower nodes, one folder each) reads it back.
    DIR/truth.json records the true clusters, the source, overrides, scenario and its facts:
    a side file for judging results, which no runtime reads. See docs/data.md.
    """
    import shutil

    from clusterfed.data import export as ex
    from clusterfed.data.own import CLIENT_FOLDER
    from clusterfed.run_folder import check_out_folder

    root = Path(directory)
    check_out_folder(root, "DIR")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise ClusterfedError(f"{root} is not empty; choose an empty folder, or --force to "
                              f"replace its client folders and truth.json")
    _, config = _resolve(source, overrides, data_dir)
    from clusterfed.sim.simulation import build_federation_for

    federation = build_federation_for(config)
    ex.check_exportable(federation, fmt)
    if root.is_dir():
        # Only now that the federation can be written: stale client folders of a larger
        # federation would otherwise join this one.
        for old in root.iterdir():
            if old.is_dir() and CLIENT_FOLDER.match(old.name):
                shutil.rmtree(old)
        (root / ex.TRUTH_FILE).unlink(missing_ok=True)
    n = federation.num_clients
    width = len(str(n))

    def report(k: int, folder: Path) -> None:
        c = federation.clients[k]
        click.echo(f"[{k + 1:{width}d}/{n}] {folder}: {c.num_train} train, {len(c.test_y)} test, "
                   f"true cluster {int(federation.true_clusters[k])}")

    ex.export_federation(federation, root, fmt, on_client=report)
    truth = ex.write_truth(root, ex.truth_record(federation, source, overrides,
                                                 config["scenario"]))
    shape = list(federation.input_shape)
    # CSV rows are flat: the model's shape is the federation's agreement.
    agreed = f" data.input_shape=[{','.join(map(str, shape))}]" if fmt == "csv" and len(
        shape) > 1 else ""
    click.echo(f"{n} clients ({fmt}) in {root}; true clusters in {truth} (not read by runs); "
               f"run on them with: clusterfed run {source} data.dataset=folders "
               f"data.root={root}{agreed}")


@main.group()
def secret() -> None:
    """The clients' privacy secret (run.privacy with a secret file)."""


@secret.command("new")
@click.argument("file")
def secret_new(file: str) -> None:
    """Write a new secret FILE (32 random bytes, mode 0600); never overwrites.

    Give a copy to every client out of band, never to the server: in-process as
    run.privacy_secret_file=FILE, on a Flower SuperNode as node config privacy-secret-file.
    """
    from clusterfed.client.secret import new_secret_file, read_secret_file, secret_id

    path = new_secret_file(file)
    click.echo(f"wrote {path}; its id (safe to compare between sites): "
               f"{secret_id(read_secret_file(path))}")


@main.group()
def flower() -> None:
    """Run on Flower: a real SuperLink and SuperNodes (needs clusterfed[flower])."""


@flower.command("local")
@click.argument("source", required=False)
@click.argument("overrides", nargs=-1)
@click.option("--clients", type=click.IntRange(min=1),
              help="SuperNodes to start (default: the scenario's clients).")
@click.option("--out", help="Run folder (default runs/NAME-ALGORITHM-TIME).")
@click.option("--data-dir", help="Data root of the nodes (default $CLUSTERFED_DATA or the cache).")
@click.option("--resume", "resume_dir", help="Continue this run folder from its checkpoint.")
@click.option("--secure", is_flag=True,
              help="TLS on the SuperLink (test certificates) and SuperNode authentication.")
@click.option("--simulation", is_flag=True,
              help="Flower's simulation runtime (Ray) instead of SuperNode processes.")
@click.option("--client-cpus", type=click.IntRange(min=1), default=1, show_default=True,
              help="Simulation runtime: CPUs per virtual node (a whole number).")
@click.option("--client-gpus", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="Simulation runtime: GPUs per virtual node.")
@click.option("--reply-timeout", type=click.FloatRange(min=0.0, min_open=True), default=600.0,
              show_default=True,
              help="Seconds a step waits for replies before leaving missing clients out.")
@click.option("--own-data", help="A folder of client-K folders: SuperNode K serves client-K "
              "(data.dataset=folders; PRESET only sets the training, default quickstart).")
@click.option("--secret-file", help="The clients' privacy secret (clusterfed secret new), "
              "given to every SuperNode, never to the server; with run.privacy.")
@click.option("--verbose-flower", is_flag=True, help="Stream all of Flower's log lines.")
@click.option("--isolation", type=click.Choice(["process", "subprocess"]), default="process",
              show_default=True,
              help="process: one long-lived ClientApp worker per SuperNode; subprocess: "
                   "Flower's fresh ClientApp process per message (slower).")
@click.option("--overwrite", is_flag=True, help="Start over in an --out that holds a run cut "
              "off before its end (refused without it: --resume continues that run).")
def flower_local(source: str | None, overrides: tuple[str, ...], clients: int | None,
                 out: str | None, data_dir: str | None, resume_dir: str | None, secure: bool,
                 simulation: bool, client_cpus: int, client_gpus: float, reply_timeout: float,
                 own_data: str | None, secret_file: str | None, verbose_flower: bool,
                 isolation: str, overwrite: bool) -> None:
    """Run PRESET or CONFIG.yaml on a SuperLink and SuperNodes started on 127.0.0.1."""
    try:
        from clusterfed.flower.launch import run_local
    except ImportError as err:
        raise ClusterfedError(f"Flower is not installed ({err}): "
                              f"pip install 'clusterfed[flower]'") from err

    if resume_dir:
        from clusterfed.run_folder import read_config

        folder = _resumable(resume_dir, source, overrides)
        config = read_config(folder)
    else:
        if not source and not own_data:
            raise ClusterfedError("give a preset name or a config file (see `clusterfed presets`)")
        name, config = _resolve(source or "quickstart", overrides, None)
        folder = _out_dir(out, name, config["algorithm"]["name"])
        _refuse_cut_off(folder, overwrite, "clusterfed flower local")
    summary = run_local(config, folder, clients=clients, data_dir=data_dir,
                        resume=bool(resume_dir), secure=secure, simulation=simulation,
                        client_cpus=client_cpus, client_gpus=client_gpus,
                        reply_timeout=reply_timeout, own_data=own_data,
                        secret_file=secret_file, echo=click.echo, verbose=verbose_flower,
                        isolation=isolation)
    click.echo(result_line(summary))
    click.echo(f"run folder: {folder}")


@flower.command("worker", context_settings={"ignore_unknown_options": True,
                                            "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def flower_worker(args: tuple[str, ...]) -> None:
    """The long-lived ClientApp of a SuperNode started with --isolation process (--help)."""
    try:
        from clusterfed.flower.worker import main as worker_main
    except ImportError as err:
        raise ClusterfedError(f"Flower is not installed ({err}): "
                              f"pip install 'clusterfed[flower]'") from err
    raise SystemExit(worker_main(list(args)))


@main.command("export")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--to", "tracker", type=click.Choice(["tensorboard", "mlflow", "wandb"]),
              required=True, help="The tracker to log the runs to.")
@click.option("--logdir", help="TensorBoard: write LOGDIR/RUN/ (default: each run folder's "
              "tensorboard/); W&B: its files' folder.")
@click.option("--experiment", help="The experiment name (default: FOLDER's name).")
def export_runs(folder: str, tracker: str, logdir: str | None, experiment: str | None) -> None:
    """Log finished run folders (a run, a comparison, a sweep, a reproduction) to a tracker,
    each run as its own run of one experiment; MLflow's store is MLFLOW_TRACKING_URI."""
    from clusterfed.trackers.export import export

    names = export(folder, tracker, logdir=logdir, experiment=experiment)
    click.echo(f"{len(names)} run(s) logged to {tracker}: {', '.join(names)}")


@main.command()
@click.argument("folders", nargs=-1, required=True)
@click.option("--truth", "truth_file", help="JSON with {\"true_clusters\": [...]} (an exported "
              "scenario's truth.json): score the runs' clusterings against it.")
def report(folders: tuple[str, ...], truth_file: str | None) -> None:
    """Write report.md with plots into each run or comparison folder."""
    from clusterfed.report import write_report

    for folder in folders:
        click.echo(f"wrote {write_report(folder, truth_file)}")


def entry(argv: Sequence[str] | None = None) -> None:
    """The console script: user errors print one line and exit 2, never a traceback."""
    try:
        main(args=argv, standalone_mode=False, prog_name="clusterfed")
    except ClusterfedError as err:
        # One line whatever the message holds (a library's text may span several).
        click.echo(f"error: {' '.join(str(err).split())}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        # One line, as for every other mistake: click's usage block would bury it.
        hint = (f" (see {err.ctx.command_path} --help)"
                if isinstance(err, click.UsageError) and err.ctx is not None else "")
        click.echo(f"error: {err.format_message()}{hint}", err=True)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    entry()
