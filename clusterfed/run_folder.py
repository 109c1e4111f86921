"""The run folder: config.yaml, metrics.jsonl, events.jsonl, checkpoint.npz, summary.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.state import dumps, loads, save_atomic

CHECKPOINT = "checkpoint.npz"


class RunFolder:
    """Appends records as they happen, so a crash loses at most the round in progress."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def start(self, config: Mapping[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(cfg.dump(config))
        for name in ("metrics.jsonl", "events.jsonl"):
            (self.path / name).write_text("")
        (self.path / CHECKPOINT).unlink(missing_ok=True)
        (self.path / "summary.json").unlink(missing_ok=True)

    def append(self, name: str, record: Mapping[str, Any]) -> None:
        with open(self.path / name, "a") as f:
            f.write(json.dumps(record) + "\n")

    def save_checkpoint(self, payload: Any) -> None:
        save_atomic(self.path / CHECKPOINT, dumps(payload))

    def load_checkpoint(self) -> Any | None:
        path = self.path / CHECKPOINT
        return loads(path.read_bytes()) if path.exists() else None

    def truncate_after(self, completed_rounds: int) -> None:
        """Drop records of rounds after the checkpoint: they will be run again."""
        for name in ("metrics.jsonl", "events.jsonl"):
            path = self.path / name
            if not path.exists():
                continue
            kept = [line for line in path.read_text().splitlines()
                    if line and json.loads(line).get("round", 0) <= completed_rounds]
            path.write_text("".join(line + "\n" for line in kept))

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        save_atomic(self.path / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())


def read_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a run folder: it has no config.yaml")
    return cfg.resolve(cfg.load_source(str(path))[1])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
