"""The Flower ServerApp: the simulator's round loop, with the client tasks run on SuperNodes.

Any registered algorithm runs unchanged: `Simulation` samples clients by id with the run's seeded
generator, plans, updates, evaluates, checkpoints and writes the run folder exactly as in-process;
only its executor is the `FlowerExecutor`. The run config (`[tool.flwr.app.config]` of the app,
or `flwr run --run-config`) says which experiment to run and where to write it; see
`examples/flower/pyproject.toml`.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from clusterfed import config as cfg
from clusterfed.data.scenarios.drift import refuse_drift
from clusterfed.errors import ClusterfedError
from clusterfed.flower.executor import FlowerExecutor
from clusterfed.run_folder import checkpoint_files, read_config
from clusterfed.sim.simulation import Simulation

app = ServerApp()


def experiment_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The clusterfed config a run config names: `config` (YAML or JSON text of a config), else
    `preset`, each with the space-separated `overrides` (key=value) applied."""
    text = str(run_config.get("config", "") or "")
    source: str | dict[str, Any] = (cfg.load_yaml(text) if text.strip()
                                    else str(run_config.get("preset", "quickstart")))
    overrides = str(run_config.get("overrides", "") or "").split()
    return cfg.resolve(source, overrides)


def progress_line(total: int) -> Any:
    """A Simulation callback printing one line per round (Flower streams the ServerApp's output)."""
    def report(done: int, record: Mapping[str, Any]) -> None:
        parts = [f"round {done}/{total}"]
        if record.get("train_loss") is not None:
            parts.append(f"train loss {record['train_loss']:.4f}")
        if "mean_accuracy" in record:
            parts.append(f"mean accuracy {record['mean_accuracy']:.4f}")
            parts.append(f"{record['n_clusters']} clusters")
        print("[clusterfed] " + ", ".join(parts), flush=True)
    return report


def run_experiment(grid: Grid, run_config: Mapping[str, Any], *, report: bool = True
                   ) -> dict[str, Any]:
    """Join the nodes, then run (or resume) the experiment; returns its summary.

    `report`: also write report.md with its plots into the run folder.
    """
    out = Path(str(run_config.get("out-dir", "runs/flower"))).expanduser()
    resume = bool(run_config.get("resume", False))
    if resume and not checkpoint_files(out):
        raise ClusterfedError(f"resume=true, but {out} holds no checkpoint to resume from")
    # A resumed run continues with its folder's own config, whatever the run config says.
    config = read_config(out) if resume else experiment_config(run_config)
    config["run"]["progress"] = False    # no progress bar in a log stream; one line per round
    refuse_drift(config, "under Flower")
    executor = FlowerExecutor(grid, config,
                              reply_timeout=float(run_config.get("reply-timeout", 600.0)),
                              join_timeout=float(run_config.get("join-timeout", 300.0)))
    print(f"[clusterfed] {config['algorithm']['name']}: waiting for the nodes", flush=True)
    executor.join()
    refused = executor.admission.refused if executor.admission else {}
    print(f"[clusterfed] {len(executor.catalog)} clients joined"
          + (f", {len(refused)} node(s) refused (partitions {sorted(refused)}: see "
             f"events.jsonl)" if refused else "")
          + "; " + (f"resuming {out}" if resume else f"writing {out}"), flush=True)
    # With the privacy secret on the nodes only, a node maps the initial models into P-space.
    sim = Simulation(config, out, federation=executor.federation(), executor=executor,
                     callbacks=[progress_line(config["train"]["rounds"])],
                     initial=executor.initial_models if executor.node_secrets else None)
    summary = sim.run(resume=resume)
    if report:
        from clusterfed.report import write_report

        write_report(out)
    print("[clusterfed] done: " + json.dumps(
        {"mean_accuracy": summary["final"]["mean_accuracy"],
         "n_clusters": summary["clustering"]["n_clusters"], "ari": summary["clustering"]["ari"],
         "run_folder": str(out)}), flush=True)
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    # clusterfed's own warnings (missing clients, rejected replies) into the streamed log; the
    # root logger is Flower's.
    logger = logging.getLogger("clusterfed")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[clusterfed] %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    run_experiment(grid, context.run_config)
