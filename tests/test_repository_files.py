"""The repository keeps run records small: no checkpoint, no large binary is ever committed.

A run folder copied into docs/ keeps its summary, config and metrics; its checkpoint and
anything over `MAX_BYTES` stay out. The only checkpoints tracked are the few-kilobyte
fixtures under tests/data/ that test the checkpoint format itself.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
MAX_BYTES = 1 << 20
# Model weights and optimiser state, whatever wrote them.
CHECKPOINT_SUFFIXES = (".npz", ".npy", ".pt", ".pth", ".ckpt", ".safetensors", ".pkl", ".h5")
FIXTURES = "tests/data/"
MAX_FIXTURE_BYTES = 64 << 10


def tracked_files(root: Path) -> list[str] | None:
    """The files git tracks under `root`, or None where `root` is no git checkout."""
    if shutil.which("git") is None:
        return None
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True)
    if listed.returncode != 0:
        return None
    return [name for name in listed.stdout.decode().split("\0") if name]


def offending(root: Path, names: list[str], max_bytes: int = MAX_BYTES) -> list[str]:
    """One line per tracked file that is too large or a checkpoint outside the fixtures."""
    found = []
    for name in names:
        path = root / name
        if not path.is_file():      # deleted in the work tree, not yet committed
            continue
        size = path.stat().st_size
        checkpoint = name.endswith(CHECKPOINT_SUFFIXES) or Path(name).stem == "checkpoint"
        if checkpoint and not (name.startswith(FIXTURES) and size <= MAX_FIXTURE_BYTES):
            found.append(f"{name}: a checkpoint ({size:,} bytes); keep summary, config, metrics")
        elif size > max_bytes:
            found.append(f"{name}: {size:,} bytes, over {max_bytes:,}")
    return found


def test_no_tracked_checkpoint_or_large_file():
    names = tracked_files(ROOT)
    if names is None:
        pytest.skip("not a git checkout (or no git): nothing tracked to check")
    assert names, "git lists no files"
    assert offending(ROOT, names) == []


def test_the_check_finds_a_checkpoint_and_a_large_file(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    run = tmp_path / "docs" / "runs" / "r0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (run / "checkpoint.npz").write_bytes(b"\0" * 100)
    (run / "weights.bin").write_bytes(b"\0" * (MAX_BYTES + 1))
    fixture = tmp_path / "tests" / "data" / "old"
    fixture.mkdir(parents=True)
    (fixture / "checkpoint.npz").write_bytes(b"\0" * 100)
    (fixture / "big.npz").write_bytes(b"\0" * (MAX_FIXTURE_BYTES + 1))
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    names = tracked_files(tmp_path)
    assert names is not None and len(names) == 5
    found = offending(tmp_path, names)
    assert [line.split(":")[0] for line in found] == [
        "docs/runs/r0/checkpoint.npz", "docs/runs/r0/weights.bin", "tests/data/old/big.npz"]
    assert "a checkpoint" in found[0] and "over 1,048,576" in found[1]


def test_outside_a_git_checkout_nothing_is_listed(tmp_path):
    assert tracked_files(tmp_path) is None
