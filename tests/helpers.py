"""Small configurations shared by the simulator, contract and CLI tests."""

from __future__ import annotations

from typing import Any

from clusterfed import config as cfg
from clusterfed.cli import entry


def tiny_config(algorithm: str = "fedavg", **sections: dict[str, Any]) -> dict[str, Any]:
    """Digits, label swap, 8 clients in 4 true clusters, a few quick rounds."""
    base = {
        "seed": 3,
        "data": {"dataset": "digits"},
        "scenario": {"kind": "label_swap", "clients": 8, "clusters": 4},
        "model": {"name": "digits_cnn"},
        "train": {"rounds": 4, "participation": 0.5, "local_epochs": 1, "batch_size": 16,
                  "lr": 0.1},
        "algorithm": {"name": algorithm},
        "run": {"progress": False, "checkpoint_every": 1},
    }
    return cfg.merge(cfg.merge(cfg.DEFAULTS, base), sections)


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary without its wall-clock time."""
    return {k: v for k, v in summary.items() if k != "wall_seconds"}


def cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """Run the command line in-process: (exit code, stdout, stderr)."""
    try:
        entry(list(argv))
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def uneven_digits() -> Any:
    """Digits, 6 clients of unequal sizes (quantity skew), so step counts and last batches
    differ: the executors that batch clients must mask and regroup them."""
    from clusterfed.data import build_federation, load_dataset
    return build_federation(load_dataset("digits"),
                            {"kind": "label_swap", "clients": 6, "clusters": 2,
                             "samples_per_client": 40, "test_samples_per_client": 15,
                             "quantity_skew": 0.6}, seed=1)
