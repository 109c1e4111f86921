"""What one message costs a deployment SuperNode, per ClientApp isolation mode, side by side.

Each run starts a SuperLink and N SuperNodes on 127.0.0.1 as `clusterfed flower local` does
(`LocalFederation`), runs a short experiment (default: quickstart, 4 clients, 4 rounds of 1
local epoch, evaluated every round) and stops them. Modes are interleaved (A B, B A, ...) in one
sitting, so the machine's load falls on both alike.

Per message it reports:
- node CPU: CPU seconds of every node-side process (each SuperNode, its SuperExec and ClientApp
  processes, or its ClientApp worker), from /proc, between the run's submission and its end,
  divided by the messages the ClientApps handled;
- from inside the ClientApp (clusterfed.flower.cost, CLUSTERFED_MESSAGE_COST_LOG): the CPU a
  process spends before the handler (a fresh process: interpreter, imports, FAB, app loading;
  a long-lived one: the overhead between messages), the handler's CPU when it built the node's
  federation and when the federation was cached, and the wall from process start to handler;
- wall per round, from the server's `[clusterfed] round r/R` lines (rounds 2.., so the hellos
  and the first round's start-up are left out), and per message (a round's wall over the
  messages a node handles per round).
Building the federation is also timed alone, in this process, for the split startup/data/task.

    OMP_NUM_THREADS=1 python benchmarks/flower_message_cost.py [--modes subprocess,process]
        [--repeats 2] [--clients 4] [--rounds 4] [--preset quickstart] [key=value ...]
    python benchmarks/flower_message_cost.py --idle 60     # what idle nodes cost (polling)

A mode may be MODE@PATH: its Flower processes run with PYTHONPATH=PATH, another checkout (the
code before a change), so before and after run interleaved too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed.flower.cost import LOG_ENV
from clusterfed.flower.launch import run_config_for
from clusterfed.flower.local import ISOLATION_MODES, LocalFederation, descendants
from clusterfed.flower.worker import READY

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, reaped: bool = True) -> float:
    """CPU of a process (zombies too) and, with `reaped`, of the children it has reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(f) for f in fields[11:15 if reaped else 13]) / TICK  # utime stime cu cs


def node_cpu(federation: LocalFederation) -> tuple[float, float]:
    """CPU seconds so far of the SuperNode processes themselves, and of every other node-side
    process (their SuperExecs and ClientApp processes, or the ClientApp workers)."""
    supernodes = others = 0.0
    for name, proc in federation.processes.items():
        if name.startswith(("supernode-", "clientapp-")):
            pid = proc.popen.pid
            own = cpu_seconds(pid, reaped=False) if name.startswith("supernode-") else 0.0
            supernodes += own
            others += sum(cpu_seconds(p) for p in [pid, *descendants(pid)]) - own
    return supernodes, others


def experiment(preset: str, clients: int, rounds: int, overrides: list[str]) -> dict[str, Any]:
    _, raw = cfg.load_source(preset)
    return cfg.resolve(raw, [
        f"scenario.clients={clients}", f"scenario.clusters={min(2, clients)}",
        f"train.rounds={rounds}", "train.local_epochs=1", "eval.every=1",
        "run.checkpoint_every=0", "run.progress=false", "run.threads=1", *overrides])


def build_cpu(config: dict[str, Any]) -> float:
    """CPU seconds to build one node's federation here (after a warm-up build)."""
    from clusterfed.flower.node import Population

    Population.build(config)
    start = time.process_time()
    Population.build(config)
    return time.process_time() - start


def ready(federation: LocalFederation, timeout: float = 300.0) -> None:
    """Wait until every worker has preloaded the app (its log says so), and 3 s more for the
    SuperNodes to connect."""
    deadline = time.monotonic() + timeout
    logs = [p.log_path for name, p in federation.processes.items()
            if name.startswith("clientapp-")]
    while time.monotonic() < deadline and not all(
            READY in path.read_text(errors="replace") for path in logs if path.exists()):
        time.sleep(0.5)
    time.sleep(3.0)


def one_run(label: str, config: dict[str, Any], workdir: Path, clients: int) -> dict[str, Any]:
    """One run of the mode a label names: MODE, or MODE@PATH to run the Flower processes with
    PYTHONPATH=PATH (another checkout of clusterfed: a before/after in one sitting)."""
    mode, _, tree = label.partition("@")
    log_path = workdir / "cost.jsonl"
    saved = dict(os.environ)
    os.environ[LOG_ENV] = str(log_path)            # the Flower processes inherit both
    if tree:
        os.environ["PYTHONPATH"] = tree
    federation = LocalFederation(clients, workdir / "flower", isolation=mode,
                                 echo=lambda line: None)
    rounds: list[float] = []

    def on_line(line: str) -> None:
        if "[clusterfed] round " in line:
            rounds.append(time.monotonic())

    load = [os.getloadavg()[0]]
    try:
        federation.start()
        ready(federation)
        (link0, app0), t0 = node_cpu(federation), time.monotonic()
        code = federation.submit(run_config_for(config, workdir / "run"), timeout=1800,
                                 on_line=on_line)
        (link1, app1), t1 = node_cpu(federation), time.monotonic()
    finally:
        federation.stop()
        os.environ.clear()
        os.environ.update(saved)
    load.append(os.getloadavg()[0])
    if code != 0:
        raise SystemExit(f"{label}: flwr run failed; logs in {federation.logs}")
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    per_round = [b - a for a, b in zip(rounds, rounds[1:], strict=False)]
    work = [r for r in records if r["group"] != "hello"]
    return {"mode": label, "messages": len(records), "supernode_cpu": link1 - link0,
            "idle_cpu": (link0 + app0) / clients,
            "app_cpu": app1 - app0, "node_cpu": link1 - link0 + app1 - app0,
            "run_wall": t1 - t0, "round_wall": per_round,
            "per_node_round": len(work) / (clients * config["train"]["rounds"]),
            "records": records, "load": load}


def idle(label: str, clients: int, workdir: Path, seconds: float) -> tuple[float, float]:
    """CPU seconds per minute of one idle node: its SuperNode, and its SuperExec or worker."""
    mode, _, tree = label.partition("@")
    saved = dict(os.environ)
    if tree:
        os.environ["PYTHONPATH"] = tree
    federation = LocalFederation(clients, workdir / "flower", isolation=mode,
                                 echo=lambda line: None)
    try:
        federation.start()
        ready(federation)
        (link0, app0), t0 = node_cpu(federation), time.monotonic()
        time.sleep(seconds)
        (link1, app1), t1 = node_cpu(federation), time.monotonic()
    finally:
        federation.stop()
        os.environ.clear()
        os.environ.update(saved)
    scale = 60.0 / (t1 - t0) / clients
    return (link1 - link0) * scale, (app1 - app0) * scale


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def summarise(runs: list[dict[str, Any]]) -> dict[str, float]:
    records = [r for run in runs for r in run["records"]]
    first = [r for r in records if r["first_in_process"]]
    later = [r for r in records if not r["first_in_process"]]
    round_wall = mean([w for run in runs for w in run["round_wall"]])
    per_node_round = mean([run["per_node_round"] for run in runs])
    messages = sum(run["messages"] for run in runs)
    return {
        "runs": len(runs),
        "messages": mean([run["messages"] for run in runs]),
        "node_cpu": sum(run["node_cpu"] for run in runs) / messages,
        "supernode_cpu": sum(run["supernode_cpu"] for run in runs) / messages,
        "app_cpu": sum(run["app_cpu"] for run in runs) / messages,
        "first_cpu": mean([r["cpu_before"] + r["cpu_handler"] for r in first]),
        # A long-lived process starts once per node: what a message costs once it has.
        "later_cpu": mean([r["cpu_before"] + r["cpu_handler"] for r in later]),
        "startup_cpu": mean([r["cpu_before"] for r in first]),
        "processes": mean([len({r["pid"] for r in run["records"]}) for run in runs]),
        "between_cpu": mean([r["cpu_before"] for r in later]),
        "handler_built": mean([r["cpu_handler"] for r in records if r["built"]]),
        "handler_cached": mean([r["cpu_handler"] for r in records if not r["built"]]),
        "startup_wall": mean([r["wall_before"] for r in first
                              if r["wall_before"] is not None and r["group"] != "hello"]),
        "handler_wall": mean([r["wall_handler"] for r in records]),
        "round_wall": round_wall,
        "message_wall": round_wall / per_node_round,
        "load": mean([x for run in runs for x in run["load"]]),
        "idle_cpu": mean([run["idle_cpu"] for run in runs]),
    }


def table(summaries: dict[str, dict[str, float]]) -> str:
    rows = [("runs", "runs", "{:.0f}"), ("messages per run", "messages", "{:.0f}"),
            ("ClientApp processes per run", "processes", "{:.0f}"),
            ("node CPU s / message (all node processes)", "node_cpu", "{:.2f}"),
            ("  the SuperNode processes", "supernode_cpu", "{:.2f}"),
            ("  SuperExec + ClientApp processes (or workers)", "app_cpu", "{:.2f}"),
            ("ClientApp CPU s, a process's first message", "first_cpu", "{:.2f}"),
            ("ClientApp CPU s, its later messages", "later_cpu", "{:.3f}"),
            ("  ClientApp start-up CPU s (per process)", "startup_cpu", "{:.2f}"),
            ("  CPU s between messages (long-lived process)", "between_cpu", "{:.3f}"),
            ("  handler CPU s, building the federation", "handler_built", "{:.3f}"),
            ("  handler CPU s, federation cached", "handler_cached", "{:.3f}"),
            ("ClientApp start-up wall s (process start to handler)", "startup_wall", "{:.2f}"),
            ("handler wall s", "handler_wall", "{:.3f}"),
            ("wall s / round (server)", "round_wall", "{:.2f}"),
            ("wall s / message (round / messages per node per round)", "message_wall",
             "{:.2f}"),
            ("node CPU s before the run, per node (process starts)", "idle_cpu", "{:.2f}"),
            ("load average (1 min, around the runs)", "load", "{:.2f}")]
    modes = list(summaries)
    width = max(len(label) for label, _, _ in rows)
    def header(label: str) -> str:
        mode, _, tree = label.partition("@")
        return f"{mode}@{Path(tree).name}" if tree else mode

    lines = [f"{'':<{width}}  " + "  ".join(f"{header(m):>14}" for m in modes)]
    for label, key, fmt in rows:
        cells = []
        for m in modes:
            value = summaries[m][key]
            cells.append(f"{'-' if value != value else fmt.format(value):>14}")
        lines.append(f"{label:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the preset")
    parser.add_argument("--modes", default="subprocess,process",
                        help=f"isolation modes, comma-separated ({', '.join(ISOLATION_MODES)}); "
                             f"MODE@PATH runs the Flower processes with PYTHONPATH=PATH")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, interleaved")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--preset", default="quickstart")
    parser.add_argument("--keep", help="keep the run folders here (default: a temporary one)")
    parser.add_argument("--idle", type=float, metavar="SECONDS",
                        help="instead: the CPU idle nodes use (their polling), over SECONDS")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    config = experiment(args.preset, args.clients, args.rounds, args.overrides)

    from common import machine  # noqa: E402 (benchmarks/ is on sys.path when run as a script)

    print("== Flower deployment: cost of one message to a SuperNode, per isolation mode ==")
    print(machine())
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"{args.preset}, {args.clients} SuperNodes, {args.rounds} rounds x (train + evaluate), "
          f"1 local epoch, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    if args.idle:
        with tempfile.TemporaryDirectory(prefix="flower-idle-") as tmp:
            for i, mode in enumerate(modes):
                link, app = idle(mode, args.clients, Path(tmp) / str(i), args.idle)
                print(f"{mode}: idle CPU s per minute per node: SuperNode {link:.2f}, "
                      f"SuperExec or worker {app:.2f} (load {os.getloadavg()[0]:.2f})")
        return 0
    data_cpu = build_cpu(config)
    print(f"building one node's federation in-process: {data_cpu:.3f} CPU s")
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="flower-msg-cost-"))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    try:
        for r in range(args.repeats):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                run = one_run(mode, config, root / f"{mode.split('@')[0]}-{r}-"
                              f"{modes.index(mode)}", args.clients)
                runs[mode].append(run)
                print(f"  {mode:<10} run {r}: {run['messages']} messages, "
                      f"node CPU {run['node_cpu']:.1f} s, wall {run['run_wall']:.1f} s, "
                      f"load {run['load'][0]:.2f} -> {run['load'][1]:.2f}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(table({m: summarise(runs[m]) for m in modes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
