"""One run folder's run, whatever state a cut-off command left it in.

A finished run (summary.json) is read back, a cut-off one resumes from its checkpoint, a new
one runs: `reproduce`, `sweep` and FL+HC's pairings can be rerun until done, losing at most
the rounds since the last checkpoint. A folder holding another config is refused, not reused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clusterfed.errors import ConfigError
from clusterfed.run_folder import read_config
from clusterfed.sim.simulation import resume_run, run_config

# What makes two runs the same run. `eval` is left out: a reproduction may evaluate less often
# than the finished run it reads back (its final figures are the same round's).
IDENTITY = ("seed", "data", "scenario", "model", "train", "algorithm", "newcomers")
# Where a table sets runs' per-round figures side by side (compare, sweep), evaluation counts.
IDENTITY_WITH_EVAL = (*IDENTITY, "eval")


def same_data(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The data section up to where the files are read from."""
    return {k: v for k, v in a.items() if k != "root"} == {
        k: v for k, v in b.items() if k != "root"}


def run_or_resume(config: Mapping[str, Any], folder: Path, federation: Any,
                  data_dir: str | None, identity: Sequence[str] = IDENTITY) -> dict[str, Any]:
    """A finished run's summary, a cut-off one resumed, or a new run."""
    if (folder / "config.yaml").exists():
        held = read_config(folder)
        differs = [k for k in identity if held.get(k) != config.get(k)
                   and not (k == "data" and same_data(held[k], config[k]))]
        if differs:
            raise ConfigError(f"{folder} holds a run of another config ({', '.join(differs)} "
                              f"differ): choose another --out")
    if (folder / "summary.json").exists():
        return json.loads((folder / "summary.json").read_text())
    if (folder / "checkpoint.npz").exists():
        return resume_run(folder, data_dir=data_dir)
    return run_config(config, folder, federation=federation)
