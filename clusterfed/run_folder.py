"""The run folder: config.yaml, metrics.jsonl, events.jsonl, checkpoint.npz, summary.json."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.state import dumps, loads, save_atomic

CHECKPOINT = "checkpoint.npz"
LOCK = ".lock"

try:
    import fcntl
except ImportError:   # Windows: no flock; runs there go unguarded
    fcntl = None  # type: ignore[assignment]


class FolderBusy(ConfigError):
    """Another process is writing this run folder."""


class RunFolder:
    """Appends records as they happen, so a crash loses at most the round in progress."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the folder's lock while a run writes it: two runs appending to one folder would
        interleave their rounds and overwrite each other's checkpoint. An flock, so a killed
        run leaves no stale lock behind."""
        if fcntl is None:
            yield
            return
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise FolderBusy(busy_message(self.path, writer(self.path))) from None
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            os.close(fd)   # releases the flock

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


def writer(path: Path) -> int | None:
    """The pid of the process writing the run folder `path`, or None when none is."""
    if fcntl is None or not (path / LOCK).exists():
        return None
    fd = os.open(path / LOCK, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode().strip()
            return int(text) if text.isdigit() else -1
        return None
    finally:
        os.close(fd)


def busy_message(path: Path, pid: int | None) -> str:
    who = f"process {pid}" if pid and pid > 0 else "another process"
    return (f"{path} is being written by {who}, a run still going: wait for it, or stop it "
            f"and continue it with --resume")


def refuse_busy(path: Path) -> None:
    """Refuse a folder another process is writing, before anything touches it."""
    pid = writer(path)
    if pid is not None:
        raise FolderBusy(busy_message(path, pid))


def read_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a run folder: it has no config.yaml")
    return cfg.resolve(cfg.load_source(str(path))[1])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
