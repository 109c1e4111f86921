"""Two runs never write one run folder: the second is refused, the first's files untouched."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from helpers import cli, tiny_config

from clusterfed.run_folder import CHECKPOINT, FolderBusy, RunFolder, writer
from clusterfed.sim.simulation import resume_run, run_config

pytest.importorskip("fcntl", reason="the run folder's lock is an flock (POSIX)")

# Another process holds the folder as a run would, until its stdin closes.
HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from clusterfed.run_folder import RunFolder
    with RunFolder(Path(sys.argv[1])).writing():
        print("held", flush=True)
        sys.stdin.read()
""")


@pytest.fixture
def held(tmp_path):
    """A folder with a cut-off run's files, written by another live process."""
    run_config(tiny_config("fedavg"), tmp_path)
    (tmp_path / "summary.json").unlink()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield tmp_path, proc
    proc.stdin.close()
    proc.wait(timeout=30)


def files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != ".lock"}


def test_a_second_run_into_a_held_folder_is_refused(held):
    folder, proc = held
    before = files(folder)
    assert writer(folder) == proc.pid
    with pytest.raises(FolderBusy, match=f"being written by process {proc.pid}"):
        run_config(tiny_config("fedavg"), folder)
    with pytest.raises(FolderBusy):
        resume_run(folder)
    assert files(folder) == before


def test_the_command_line_names_the_writer_not_a_cut_off_run(capsys, held):
    folder, proc = held
    code, _, err = cli(capsys, "run", "quickstart", "scenario.clients=4", "train.rounds=2",
                       "run.progress=false", "--out", str(folder), "--overwrite")
    assert code != 0 and f"process {proc.pid}" in err and "--resume" in err
    assert (folder / CHECKPOINT).exists()


def test_the_lock_goes_with_its_process(held):
    """A killed run leaves no stale lock: the folder resumes."""
    folder, proc = held
    proc.kill()
    proc.wait(timeout=30)
    assert writer(folder) is None
    assert resume_run(folder)["rounds"] == 4


def test_one_process_cannot_hold_a_folder_twice(tmp_path):
    with RunFolder(tmp_path).writing():
        with pytest.raises(FolderBusy):
            with RunFolder(tmp_path).writing():
                pass
    with RunFolder(tmp_path).writing():   # released on leaving
        assert writer(tmp_path) is not None
    assert writer(tmp_path) is None
