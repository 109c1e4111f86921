"""Every mistake on the command line gets one line on stderr, a non-zero exit, and leaves the
disk as it was: no folder created, no earlier run's file changed. None of them trains a round
or starts a Flower process (both are replaced here by a failure), so the table runs in seconds.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from helpers import cli, tiny_config
from PIL import Image

from clusterfed.run_folder import CHECKPOINT, PREVIOUS
from clusterfed.sim.simulation import run_config

QUICK = ["scenario.clients=4", "train.rounds=2", "run.progress=false", "run.threads=1"]
FOLDERS = ["run", "quickstart", "data.dataset=folders"]


def png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def grey() -> np.ndarray:
    return np.full((8, 8), 7, np.uint8)


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """Runs, folders and files the bad commands name."""
    ws = tmp_path_factory.mktemp("ws")
    config = tiny_config("fedavg", run={"threads": 1, "executor": "sequential"},
                         train={"rounds": 2})
    run_config(config, ws / "prev")
    run_config(config, ws / "cut")
    (ws / "cut" / "summary.json").unlink()
    run_config(config, ws / "damaged")
    (ws / "damaged" / "summary.json").unlink()
    for name in (CHECKPOINT, PREVIOUS):
        path = ws / "damaged" / name
        path.write_bytes(path.read_bytes()[:300])
    (ws / "notrun").mkdir()
    (ws / "notrun" / "results.txt").write_text("not a run")
    (ws / "file.txt").write_text("a file")
    (ws / "bad.yaml").write_text("train: [unclosed\n")
    (ws / "list.yaml").write_text("- a\n- b\n")
    (ws / "short.secret").write_bytes(b"abc")
    for k in range(2):
        png(ws / "notes" / f"client-{k}" / "0" / "a.png", grey())
        png(ws / "emptyclass" / f"client-{k}" / "0" / "a.png", grey())
        png(ws / "rgb" / f"client-{k}" / "0" / "a.png", grey())
        png(ws / "gap" / f"client-{2 * k}" / "0" / "a.png", grey())
    (ws / "notes" / "client-1" / "0" / "notes.txt").write_text("taken on Monday")
    (ws / "emptyclass" / "client-1" / "1").mkdir()
    png(ws / "rgb" / "client-1" / "0" / "b.png", np.zeros((8, 8, 3), np.uint8))
    (ws / "nofolders").mkdir()
    (ws / "cwd").mkdir()
    return ws


# (argv with {ws} for the workspace, a part of the one line expected)
CASES = [
    # presets, config files, overrides
    (["run", "nope"], "unknown preset 'nope'"),
    (["run"], "give a preset name or a config file"),
    (["run", "{ws}/missing.yaml"], "missing.yaml does not exist"),
    (["run", "{ws}/bad.yaml"], "bad.yaml is not valid YAML"),
    (["run", "{ws}/list.yaml"], "must hold a mapping"),
    (["run", "quickstart", "bad.key=1"], "unknown config section 'bad'"),
    (["run", "quickstart", "train.lrr=1"], "unknown config key train.lrr"),
    (["run", "quickstart", "trainlr"], "not of the form key=value"),
    (["run", "quickstart", "a.b.c=1"], "unknown config section"),
    (["run", "quickstart", "train=1"], "names a section"),
    (["run", "quickstart", "train.rounds=0"], "train.rounds must be a positive integer"),
    (["run", "quickstart", "train.batch_size=ten"], "train.batch_size must be a positive"),
    (["run", "quickstart", "seed=x"], "seed must be an integer"),
    (["run", "quickstart", "run.threads=0"], "run.threads must be a positive integer or null"),
    (["run", "quickstart", "run.threads=-2"], "run.threads must be a positive integer"),
    (["run", "quickstart", "run.threads=1.5"], "run.threads must be a positive integer"),
    (["run", "quickstart", "run.executor=gpu"], "unknown run.executor 'gpu'"),
    (["run", "quickstart", "run.workers=0"], "run.workers must be a positive integer"),
    (["run", "quickstart", "run.checkpoint_every=-1"], "run.checkpoint_every must be"),
    (["run", "quickstart", "eval.protocol=best"], "unknown eval.protocol 'best'"),
    (["run", "quickstart", "eval.validation_fraction=1.5"], "eval.validation_fraction must"),
    (["run", "quickstart", "train.participation=0"], "nothing is trained"),
    (["run", "quickstart", "newcomers.clients=[1,1]"], "lists a client twice"),
    (["run", "quickstart", "algorithm.name=fedsgd"], "unknown algorithm 'fedsgd'"),
    (["run", "quickstart", "algorithm.k=3"], "unknown config key algorithm.k"),
    (["run", "quickstart", "model.name=vit"], "unknown model 'vit'"),
    (["run", "quickstart", "data.dataset=imagenet"], "unknown dataset 'imagenet'"),
    (["run", "quickstart", "scenario.kind=blobs"], "unknown scenario 'blobs'"),
    (["run", "quickstart", "scenario.clusters=30"], "more than scenario.clients=20"),
    (["run", "quickstart", "--bogus"], "No such option '--bogus'"),
    (["run", "quickstart", "train.lr=abc"], "train.lr must be a number, got 'abc'"),
    (["frobnicate"], "No such command 'frobnicate'"),
    # --out
    (["run", "quickstart", *QUICK, "--out", "{ws}/file.txt"], "file.txt is a file, not a folder"),
    (["run", "quickstart", *QUICK, "--out", "{ws}/file.txt/sub"], "file.txt is a file"),
    (["run", "quickstart", *QUICK, "--out", "/proc/clusterfed-run"], "cannot create the folder"),
    (["run", "quickstart", *QUICK, "--out", "{ws}/cut"], "cut off before its end"),
    (["run", "quickstart", "train.momentum=[1]", "--out", "{ws}/prev"], "train.momentum must"),
    # --resume
    (["run", "quickstart", "--resume", "{ws}/cut"], "give no preset or overrides"),
    (["run", "--resume", "{ws}/nowhere"], "no such run folder"),
    (["run", "--resume", "{ws}/notrun"], "is not a run folder"),
    (["run", "--resume", "{ws}/file.txt"], "no such run folder"),
    (["run", "--resume", "{ws}/damaged"], "every checkpoint is damaged"),
    # the privacy secret
    (["run", "quickstart", "run.privacy=permutation", "run.privacy_secret_file={ws}/no.secret"],
     "no.secret does not exist"),
    (["run", "quickstart", "run.privacy=permutation",
      "run.privacy_secret_file={ws}/short.secret"], "holds 3 bytes"),
    # own data
    ([*FOLDERS, "data.root={ws}/notes", *QUICK], "notes.txt: not an image"),
    ([*FOLDERS, "data.root={ws}/emptyclass", *QUICK], "empty class folder"),
    ([*FOLDERS, "data.root={ws}/rgb", *QUICK], "b.png is a colour image"),
    ([*FOLDERS, "data.root={ws}/gap", *QUICK], "numbered 0..1 without gaps"),
    ([*FOLDERS, "data.root={ws}/nofolders", *QUICK], "holds no client-K folders"),
    ([*FOLDERS, *QUICK], "needs data.root=DIR"),
    ([*FOLDERS, "data.root={ws}/notes", "data.format=parquet"], "unknown data.format"),
    # compare, sweep, reproduce, benchmark
    (["compare", "quickstart", "--algorithms", "fedavg,nosuch"], "unknown algorithm 'nosuch'"),
    (["compare", "quickstart", "--jobs", "0"], "Invalid value for '--jobs'"),
    (["compare", "quickstart", "--out", "{ws}/file.txt"], "is a file, not a folder"),
    (["compare", "nope"], "unknown preset 'nope'"),
    (["sweep", "flhc-grid-a", "--finished"], "--finished reads a sweep folder"),
    (["sweep", "quickstart"], "nothing to sweep"),
    (["sweep", "nope"], "unknown preset 'nope'"),
    (["reproduce", "quickstart", "--seeds", "a,b"], "--seeds takes whole numbers"),
    (["reproduce", "quickstart", "--out", "{ws}/file.txt"], "is a file, not a folder"),
    (["benchmark", "--seeds", "x"], "--seeds takes whole numbers"),
    (["benchmark", "--quick", "--out", "{ws}/file.txt"], "is a file, not a folder"),
    (["benchmark", "--jobs", "0"], "Invalid value for '--jobs'"),
    (["benchmark", "--methods", "nosuch"], "unknown algorithm 'nosuch'"),
    (["benchmark", "--datasets", "imagenet"], "unknown benchmark dataset 'imagenet'"),
    (["benchmark", "--scenarios", "nope"], "unknown benchmark scenario 'nope'"),
    (["reproduce", "quickstart", "--algorithms", "nosuch"], "unknown algorithm 'nosuch'"),
    # Flower
    (["flower", "local", "--own-data", "{ws}/notes", "--secret-file", "{ws}/no.secret",
      "quickstart", "run.privacy=permutation"], "no.secret does not exist"),
    (["flower", "local", "--secret-file", "{ws}/short.secret", "quickstart"],
     "set run.privacy=permutation"),
    (["flower", "local", "quickstart", "run.privacy=permutation",
      "run.privacy_secret_file={ws}/short.secret"], "give the file with --secret-file"),
    (["flower", "local", "--own-data", "{ws}/emptyclass", "quickstart"], "empty class folder"),
    (["flower", "local", "quickstart", "--clients", "0"], "Invalid value for '--clients'"),
    (["flower", "local", "--own-data", "{ws}/nowhere"], "is not a folder of client folders"),
    (["flower", "local", "quickstart", "--reply-timeout", "0"], "--reply-timeout"),
    (["flower", "local", "quickstart", "--isolation", "thread"], "--isolation"),
    (["flower", "local", "--resume", "{ws}/damaged"], "every checkpoint is damaged"),
    (["flower", "local", "quickstart", "--out", "{ws}/cut"], "cut off before its end"),
    (["flower", "local", "quickstart", "--out", "{ws}/file.txt"], "is a file, not a folder"),
    # the other commands
    (["scenario", "describe", "nope"], "unknown preset 'nope'"),
    (["scenario", "export", "quickstart", "{ws}/file.txt"], "is a file, not a folder"),
    (["scenario", "export", "quickstart", "{ws}/file.txt/sub"], "file.txt is a file"),
    (["scenario", "export", "quickstart", "{ws}/prev"], "is not empty"),
    (["secret", "new", "{ws}/file.txt"], "a secret file is never overwritten"),
    (["report"], "Missing argument"),
]


def tree(root: Path) -> dict[str, str]:
    """Every file and folder under `root`, with a hash of each file's content."""
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(root.rglob("*")) if p.name != ".lock"}


@pytest.fixture
def nothing_runs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a bad command got as far as training or starting Flower")

    monkeypatch.setattr("clusterfed.sim.simulation.Simulation._run", refuse)
    monkeypatch.setattr("clusterfed.flower.launch.LocalFederation", refuse, raising=False)


def test_there_are_enough_cases():
    assert len(CASES) >= 44


@pytest.mark.parametrize("argv, expected", CASES, ids=lambda v: " ".join(v)[:60]
                         if isinstance(v, list) else None)
def test_a_bad_command_is_one_line_and_changes_nothing(capsys, monkeypatch, ws, nothing_runs,
                                                        argv, expected):
    if argv[0] == "flower":
        pytest.importorskip("flwr")
    monkeypatch.chdir(ws / "cwd")   # where a default runs/... folder would appear
    before = tree(ws)
    code, _, err = cli(capsys, *(a.replace("{ws}", str(ws)) for a in argv))
    assert code != 0
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and expected in err, err
    assert tree(ws) == before
