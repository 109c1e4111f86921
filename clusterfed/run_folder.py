"""The run folder: config.yaml, metrics.jsonl, events.jsonl, checkpoint.npz (and the one before
it, checkpoint.prev.npz), summary.json."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.state import DamagedState, dumps, loads, read_parts, save_atomic
from clusterfed.strict_json import dumps as json_dumps

CHECKPOINT = "checkpoint.npz"
# The checkpoint before the newest: a resume falls back to it when the newest is damaged.
PREVIOUS = "checkpoint.prev.npz"
JOURNAL = "journal"   # sim/journal.py's folder of a long step's results
LOCK = ".lock"
log = logging.getLogger("clusterfed")

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
        make_folder(self.path)
        if fcntl is None:
            yield
            return
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
        for name in (CHECKPOINT, PREVIOUS, "summary.json"):
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self.path / JOURNAL, ignore_errors=True)   # a step journal (sim/journal)

    def append(self, name: str, record: Mapping[str, Any]) -> None:
        with open(self.path / name, "a") as f:
            f.write(json_dumps(record) + "\n")

    def save_checkpoint(self, payload: Any) -> None:
        """The new checkpoint is written whole before the last one becomes the previous: a
        crash at any moment leaves a readable checkpoint."""
        data = dumps(payload)
        tmp = self.path / f"{CHECKPOINT}.{os.getpid()}.new"
        save_atomic(tmp, data)
        if (self.path / CHECKPOINT).exists():
            os.replace(self.path / CHECKPOINT, self.path / PREVIOUS)
        os.replace(tmp, self.path / CHECKPOINT)

    def load_checkpoint(self) -> Any | None:
        """The newest readable checkpoint; a damaged newest one is replaced by the previous,
        with a warning. None when the folder has none."""
        path = readable_checkpoint(self.path)
        if path is None:
            return None
        if path.name == PREVIOUS:
            log.warning("%s is damaged or missing; resuming from the checkpoint before it",
                        self.path / CHECKPOINT)
            os.replace(path, self.path / CHECKPOINT)
            path = self.path / CHECKPOINT
        return loads(path.read_bytes())

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
        save_atomic(self.path / "summary.json", (json_dumps(summary, indent=2) + "\n").encode())


def make_folder(path: Path) -> None:
    """mkdir -p, with an impossible path (a file on the way, no permission) one error."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the folder {path}: {err.strerror}; choose another "
                          f"--out") from None


def check_out_folder(path: Path, option: str = "--out") -> None:
    """Refuse an output folder (`option` names it) that cannot be one, before anything is
    built or written: a file, or a path through a file or an unwritable folder."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file, not a folder: choose another {option}")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise ConfigError(f"{option} {path}: {existing} is a file, not a folder: choose "
                          f"another {option}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: {existing} is not writable: choose another "
                          f"{option}")


def checkpoint_files(path: Path) -> list[Path]:
    """The folder's checkpoints, newest first."""
    return [p for p in (path / CHECKPOINT, path / PREVIOUS) if p.exists()]


def readable_checkpoint(path: Path) -> Path | None:
    """The newest checkpoint file of the run folder `path` that reads whole; None when it has
    none; a ConfigError when every one is damaged."""
    files = checkpoint_files(path)
    problems = []
    for file in files:
        try:
            read_parts(file.read_bytes())
            return file
        except DamagedState as err:
            problems.append(f"{file.name}: {err}")
    if not files:
        return None
    raise ConfigError(f"{path}: every checkpoint is damaged ({'; '.join(problems)}); start the "
                      f"run over (its rounds are lost): clusterfed run {path / 'config.yaml'} "
                      f"--out {path} --overwrite")


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
