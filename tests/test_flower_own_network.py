"""A real deployment's shape on 127.0.0.1: SuperNodes each serving its own folder with the
clients' secret file, and a SuperLink whose ServerApp can open neither (an audit hook in those
processes raises on any open or listing under the sites' folder, and logs it).

Each test starts and stops its own SuperLink and SuperNodes; they compare with the in-process
simulator on the same folders (`data.dataset=folders`, `run.privacy_secret_file`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed: the Flower runtime tests need "
                    "pip install -c constraints.txt -e '.[test,flower]'")

import yaml  # noqa: E402
from flower_cases import CLIENTS, flower_config  # noqa: E402
from helpers import cli  # noqa: E402
from own_folders import own_config  # noqa: E402

from clusterfed.clustering.metrics import clustering_scores  # noqa: E402
from clusterfed.data import own  # noqa: E402
from clusterfed.flower.launch import run_config_for  # noqa: E402
from clusterfed.flower.local import LocalFederation  # noqa: E402
from clusterfed.run_folder import read_jsonl  # noqa: E402
from clusterfed.sim.simulation import run_config  # noqa: E402

pytestmark = pytest.mark.flower

RUN_TIMEOUT = 900.0
# CFL set to split the two label swaps within two rounds (3 local epochs), with CFL's privacy.
CFL = {"name": "cfl", "rho": 1.0, "stagnation_window": 1, "acceptance": "fixed",
       "gamma_max": 0.0}
TRAIN = {"local_epochs": 3, "lr": 0.05, "momentum": 0.5, "batch_size": 10}

GUARD = '''
import os, sys

_FORBIDDEN = tuple(p for p in os.environ.get("CLUSTERFED_TEST_FORBIDDEN", "").split(os.pathsep)
                   if p)
_LOG = os.environ.get("CLUSTERFED_TEST_GUARD_LOG", "")


def _note(line):
    with open(_LOG, "a") as out:
        out.write(line + "\\n")


def _guard(event, args):
    if event not in ("open", "os.listdir", "os.scandir") or not args:
        return
    if not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.path.abspath(os.fsdecode(os.fspath(args[0])))
    if path.startswith(_FORBIDDEN):
        _note(f"VIOLATION {sys.argv[0]} {path}")
        raise PermissionError(f"the server side may not open {path}")


if _FORBIDDEN and _LOG:
    _note(f"guarded {sys.argv[0]}")
    sys.addaudithook(_guard)
'''


class ServerSideGuarded(LocalFederation):
    """The SuperLink, and the ServerApp it starts, get the guard; the SuperNodes do not."""

    def guard(self, folder: Path, forbidden: list[Path]) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "sitecustomize.py").write_text(GUARD)
        self._guard_env = {
            "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]),
            "CLUSTERFED_TEST_FORBIDDEN": os.pathsep.join(str(p) for p in forbidden),
            "CLUSTERFED_TEST_GUARD_LOG": str(folder / "guard.log")}
        return folder / "guard.log"

    def _spawn(self, name, argv):
        self._spawning = name
        try:
            return super()._spawn(name, argv)
        finally:
            self._spawning = ""

    def env(self) -> dict[str, str]:
        env = super().env()
        if getattr(self, "_spawning", "") == "superlink":
            env.update(self._guard_env)
        return env


def sites_with_secret(root: Path, capsys) -> tuple[Path, Path]:
    """The sites' side, all under `root`: the small label-swap scenario exported as client-K
    folders (`clusterfed scenario export`, with its truth.json) and the shared secret."""
    root.mkdir(parents=True)
    source = root / "scenario.yaml"
    source.write_text(yaml.safe_dump(flower_config(CFL)))
    code, _, err = cli(capsys, "scenario", "export", str(source), str(root / "federation"))
    assert code == 0, err
    code, _, err = cli(capsys, "secret", "new", str(root / "federation.secret"))
    assert code == 0, err
    return root / "federation", root / "federation.secret"


def run_guarded(tmp_path: Path, sites: Path, folders: list[Path], secret: Path, config: dict
                ) -> tuple[int, Path, Path, ServerSideGuarded]:
    out = tmp_path / "run"
    federation = ServerSideGuarded(len(folders), tmp_path / "flower", own_data=folders,
                                   secret_file=secret, echo=lambda line: None)
    guard_log = federation.guard(tmp_path / "guard", [sites, secret])
    try:
        federation.start()
        code = federation.submit(run_config_for(config, out), timeout=RUN_TIMEOUT)
    finally:
        federation.stop()
    return code, out, guard_log, federation


def assert_server_saw_nothing_secret(out: Path, guard_log: Path, secret: Path, sites: Path,
                                     federation: ServerSideGuarded) -> None:
    guarded = guard_log.read_text()
    assert "VIOLATION" not in guarded, guarded
    assert "flwr-serverapp" in guarded, guarded      # the guard did run in the ServerApp
    key = secret.read_bytes()
    seen = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    seen += b"".join(p.read_bytes() for p in federation.workdir.glob("run-config-*.toml"))
    for text in (key, key.hex().encode(), str(secret).encode(), str(sites).encode()):
        assert text not in seen


def test_own_data_nodes_with_client_secrets_find_the_simulators_clusters(tmp_path, capsys):
    sites, secret = sites_with_secret(tmp_path / "sites", capsys)
    config = own_config(CFL, privacy="permutation")
    config["train"].update(TRAIN)
    in_process = own_config(CFL, root=sites, privacy="permutation",
                            privacy_secret_file=str(secret))
    in_process["train"].update(TRAIN)
    expected = run_config(in_process, tmp_path / "sim")
    code, out, guard_log, federation = run_guarded(tmp_path, sites, own.client_folders(sites),
                                                   secret, config)
    logs = "\n".join(p.tail() for p in federation.processes.values())
    assert code == 0 and (out / "summary.json").exists(), logs
    got = json.loads((out / "summary.json").read_text())
    assert got["clustering"]["assignment"] == expected["clustering"]["assignment"]
    np.testing.assert_allclose(got["final"]["per_client_accuracy"],
                               expected["final"]["per_client_accuracy"], atol=1e-6)
    # The run knows no truth; the export's truth.json does: the two label swaps were found.
    truth = json.loads((sites / "truth.json").read_text())["true_clusters"]
    assert clustering_scores(np.array(truth), np.array(got["clustering"]["assignment"]))[
        "ari"] == 1.0
    assert got["clustering"]["true_assignment"] is None and got["clustering"]["ari"] is None
    assert_server_saw_nothing_secret(out, guard_log, secret, sites, federation)


def test_a_node_with_wrongly_shaped_data_is_refused_and_the_run_finishes(tmp_path, capsys):
    sites, secret = sites_with_secret(tmp_path / "sites", capsys)
    wrong = sites / "client-1"
    with np.load(wrong / "data.npz") as data:
        x, y = data["x_train"], data["y_train"]
    (wrong / "data.npz").unlink()
    # Someone else's images: three channels.
    np.savez(wrong / "data.npz", x=np.repeat(x, 3, axis=1), y=y)
    config = own_config({"name": "fedavg"}, privacy="permutation")
    code, out, guard_log, federation = run_guarded(tmp_path, sites, own.client_folders(sites),
                                                   secret, config)
    logs = "\n".join(p.tail() for p in federation.processes.values())
    assert code == 0 and (out / "summary.json").exists(), logs
    events = read_jsonl(out / "events.jsonl")
    refused = [e for e in events if e["type"] == "node_refused"]
    assert len(refused) == 1, events
    assert refused[0]["partition"] == 1
    assert refused[0]["reason"] == "inputs shaped [3, 8, 8], the federation's are [1, 8, 8]"
    assert {"round": 0, "type": "members", "partitions": [0, 2, 3]} in events
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and len(summary["final"]["per_client_accuracy"]) == CLIENTS - 1
    assert_server_saw_nothing_secret(out, guard_log, secret, sites, federation)
