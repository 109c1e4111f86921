"""Checkpoints carry their format's version; those from before the version key still load."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import comparable, tiny_config

from clusterfed import state
from clusterfed.errors import ConfigError
from clusterfed.run_folder import CHECKPOINT, read_config
from clusterfed.sim.simulation import Simulation, resume_run, run_config


def rewritten(path: Path, version: int | None) -> None:
    """Write the file again with another version, or the old way (no version key) for None."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "__format__"}
    if version is not None:
        arrays["__format__"] = np.array(version, dtype=np.int64)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path.write_bytes(buffer.getvalue())


def test_saved_state_names_its_format_version():
    with np.load(io.BytesIO(state.dumps({"x": np.arange(3)})), allow_pickle=False) as npz:
        assert int(npz["__format__"]) == state.FORMAT_VERSION


def test_a_checkpoint_without_a_version_resumes_as_before(tmp_path):
    config = tiny_config("cfl", train={"rounds": 4})
    whole = run_config(config, tmp_path / "whole")
    Simulation(config, tmp_path / "cut", callbacks=[lambda r, _: r == 2]).run()
    rewritten(tmp_path / "cut" / CHECKPOINT, None)
    with np.load(tmp_path / "cut" / CHECKPOINT) as npz:
        assert "__format__" not in npz.files   # written the old way
    assert comparable(resume_run(tmp_path / "cut")) == comparable(whole)


def test_a_newer_format_is_refused_with_a_clear_message(tmp_path):
    path = tmp_path / CHECKPOINT
    path.write_bytes(state.dumps({"round": 1}))
    rewritten(path, state.FORMAT_VERSION + 1)
    with pytest.raises(ConfigError, match="update clusterfed"):
        state.loads(path.read_bytes())


BEFORE_FOLDERS = Path(__file__).parent / "data" / "checkpoints_before_folders"


@pytest.mark.parametrize("name", sorted(p.name for p in BEFORE_FOLDERS.iterdir()))
def test_a_checkpoint_from_before_the_method_folders_resumes_as_before(name, tmp_path):
    """Run folders cut after round 2 of 3 by the code before each method had its own folder
    (commit 91be8fd; its states were named `clusterfed.algorithms.NAME.CLASS`). Their first
    two rounds ran on another CPU, whose float sums round differently from this one's (AVX2
    against AVX-512), so the resumed run matches a whole run here to float tolerance:
    everything discrete (assignments, cluster counts, accuracies' counts) exactly."""
    old = BEFORE_FOLDERS / name
    with np.load(old / CHECKPOINT, allow_pickle=False) as npz:
        assert f'"clusterfed.algorithms.{name}.' in npz["__skeleton__"].tobytes().decode()
    shutil.copytree(old, tmp_path / "cut")
    whole = run_config(read_config(tmp_path / "cut"), tmp_path / "whole")
    assert_close(comparable(resume_run(tmp_path / "cut")), comparable(whole))


def assert_close(got: Any, want: Any, where: str = "summary") -> None:
    """Equal structure and equal values, floats to a relative 1e-6."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for key in want:
            assert_close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-6, nan_ok=True), where
    else:
        assert got == want, where


def test_a_state_no_module_defines_is_refused_with_a_clear_message():
    skeleton = '{"__dataclass__": "clusterfed.nowhere.State", "fields": {}}'
    buffer = io.BytesIO()
    np.savez(buffer, __skeleton__=np.frombuffer(skeleton.encode(), dtype=np.uint8))
    with pytest.raises(ConfigError, match="clusterfed.nowhere.State"):
        state.loads(buffer.getvalue())
