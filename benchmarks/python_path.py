"""The README's Python example against the CLI on the same config (issue 60).

Each variant runs in a fresh interpreter, taking turns (A B C, then B C A, ...), so that a
machine shared with other jobs loads them alike. The Python variant is the README's example
as a script without `if __name__ == "__main__":`, the case that used to fall back to one
process at torch's threads. Prints wall seconds, the final mean accuracy, and each variant's
ratio to the CLI's median time.

    PYTHONPATH=. python benchmarks/python_path.py [--rounds 20] [--repeats 2] \\
        [--extra run.threads=1 ...] [--variants python cli cli-threads1] [--repo PATH]

`--repo` times another checkout's clusterfed (e.g. the code before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, machine

# The README's example, as a user saves and runs it: no main guard.
SCRIPT = """\
import json, sys
from clusterfed import config
from clusterfed.sim.simulation import run_config

cfg = config.resolve("quickstart", json.loads(sys.argv[1]))
summary = run_config(cfg)
print(json.dumps({"accuracy": summary["final"]["mean_accuracy"]}))
"""


def run_variant(variant: str, overrides: list[str], work: Path, repo: Path
                ) -> tuple[float, float]:
    """(wall s, final mean accuracy) of one run in a fresh interpreter."""
    if variant == "python":
        script = work / "example.py"
        script.write_text(SCRIPT)
        argv = [sys.executable, str(script), json.dumps(overrides)]
    else:
        extra = ["run.threads=1"] if variant == "cli-threads1" else []
        argv = [sys.executable, "-m", "clusterfed", "run", "quickstart", *overrides, *extra,
                "--out", str(work / f"run-{time.time_ns()}")]
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=work, check=True,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    wall = time.perf_counter() - began
    if variant == "python":
        accuracy = json.loads(done.stdout.strip().splitlines()[-1])["accuracy"]
    else:   # "fedavg: mean accuracy 0.7523, ..."
        accuracy = float(done.stdout.split("mean accuracy ")[1].split(",")[0])
    return wall, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--extra", nargs="*", default=[], help="More overrides for every run.")
    parser.add_argument("--variants", nargs="+", default=["python", "cli", "cli-threads1"],
                        choices=["python", "cli", "cli-threads1"])
    parser.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args()
    overrides = ["algorithm.name=fedavg", f"train.rounds={args.rounds}", "run.progress=false",
                 *args.extra]
    print(machine())
    print(f"clusterfed of {args.repo}; load average at the start: {os.getloadavg()}")
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            shift = r % len(args.variants)
            for variant in args.variants[shift:] + args.variants[:shift]:
                times[variant].append(run_variant(variant, overrides, Path(tmp), args.repo))
                wall, acc = times[variant][-1]
                print(f"  {variant:13s} {wall:7.1f} s  accuracy {acc:.4f}", flush=True)
    print(f"load average at the end: {os.getloadavg()}")
    base = statistics.median(w for w, _ in times["cli"]) if "cli" in times else None
    print(f"\nquickstart {' '.join(overrides)}, median of {args.repeats}")
    print("| variant | wall s (each run) | median | mean accuracy | x the CLI's median |")
    print("| --- | --- | ---: | ---: | ---: |")
    for variant, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        each = " / ".join(f"{w:.1f}" for w, _ in runs)
        accs = " / ".join(sorted({f"{a:.4f}" for _, a in runs}))
        ratio = f"{wall / base:.2f}" if base else "-"
        print(f"| {variant} | {each} | {wall:.1f} | {accs} | {ratio} |")


if __name__ == "__main__":
    main()
