"""The Flower runtime over a real network: a SuperLink and SuperNodes on 127.0.0.1.

Each test submits a run with `flwr run` to processes this module starts and stops (one insecure
federation shared by the module, one with TLS and SuperNode authentication). They compare with
the in-process simulator run with the same seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("flwr", reason="Flower is not installed: the Flower runtime tests need "
                    "pip install -c constraints.txt -e '.[test,flower]'")

from flower_cases import CLIENTS, FLOWER_ALGORITHMS, case_id, flower_config  # noqa: E402
from helpers import cli  # noqa: E402

from clusterfed import config as cfg  # noqa: E402
from clusterfed.flower.launch import run_config_for  # noqa: E402
from clusterfed.flower.local import LocalFederation  # noqa: E402
from clusterfed.flower.worker import READY  # noqa: E402
from clusterfed.run_folder import read_jsonl  # noqa: E402
from clusterfed.sim.simulation import run_config  # noqa: E402

pytestmark = pytest.mark.flower

RUN_TIMEOUT = 900.0        # a whole run, processes included (CI machines are slow and shared)
REPLY_TIMEOUT = 300.0      # a healthy step never comes near this
KILL_REPLY_TIMEOUT = 30.0  # how long the run waits for the killed node


def start(workdir: Path, secure: bool = False):
    return LocalFederation(CLIENTS, workdir, secure=secure, echo=lambda line: None).start()


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = start(tmp_path_factory.mktemp("flower-federation"))
    yield fed
    fed.stop()


def submit(federation: LocalFederation, config: dict, out: Path, on_line=None,
           reply_timeout: float = REPLY_TIMEOUT) -> dict:
    code = federation.submit(run_config_for(config, out, reply_timeout=reply_timeout),
                             timeout=RUN_TIMEOUT, on_line=on_line)
    logs = "\n".join(p.tail() for p in federation.processes.values())
    assert code == 0 and (out / "summary.json").exists(), logs
    return json.loads((out / "summary.json").read_text())


def assert_same_run(got: dict, expected: dict) -> None:
    assert got["clustering"]["assignment"] == expected["clustering"]["assignment"]
    np.testing.assert_allclose(got["final"]["per_client_accuracy"],
                               expected["final"]["per_client_accuracy"], atol=1e-6)
    assert got["final"]["mean_accuracy"] == pytest.approx(expected["final"]["mean_accuracy"],
                                                          abs=1e-6)


@pytest.mark.parametrize("algorithm", FLOWER_ALGORITHMS, ids=case_id)
def test_supernodes_give_the_simulators_clusters_and_accuracies(federation, algorithm, tmp_path):
    config = flower_config(algorithm)
    expected = run_config(config)
    got = submit(federation, config, tmp_path / "run")
    assert_same_run(got, expected)
    # The run folder is the simulator's: config, per-round metrics, checkpoint, report.
    for name in ("config.yaml", "metrics.jsonl", "checkpoint.npz", "report.md"):
        assert (tmp_path / "run" / name).exists(), name


def test_a_killed_supernode_is_logged_the_run_finishes_and_its_restart_rejoins(federation,
                                                                                 tmp_path):
    # 6 rounds: with long-lived ClientApp workers a round takes a few seconds, and the executor
    # greets a restarted node only at the first step after it registered, so it is back a
    # round or two after the one it missed.
    config = flower_config({"name": "fedavg"}, rounds=6)
    victim = CLIENTS - 1
    killed: list[str] = []

    def kill_after_round_1(line: str) -> None:
        if "[clusterfed] round 1/" in line and not killed:
            federation.kill_node(victim)          # SIGKILL: the node and its ClientApp die
            killed.append(line)
            federation.start_node(victim)         # a new SuperNode for the same client

    summary = submit(federation, config, tmp_path / "run", on_line=kill_after_round_1,
                     reply_timeout=KILL_REPLY_TIMEOUT)
    assert killed
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    missing = [e for e in events if e["type"] == "missing_client"]
    assert any(e["client"] == victim and e["round"] == 2 and e["task"] == "train"
               for e in missing), events
    assert any(e["type"] == "client_joined" and e["client"] == victim for e in events), events
    assert summary["rounds"] == 6
    # Back in time for the last evaluation: every client has an accuracy.
    assert np.isfinite(summary["final"]["per_client_accuracy"]).all()


def processes_mentioning(text: str) -> list[int]:
    """Pids of running processes whose command line mentions `text`."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if text in entry.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(int(entry.name))
        except (OSError, UnicodeDecodeError):
            continue
    return found


def test_the_cli_runs_with_tls_and_supernode_authentication_and_stops_everything(tmp_path,
                                                                                   capsys):
    config = flower_config({"name": "fedavg"})
    expected = run_config(config)
    source = tmp_path / "tiny.yaml"
    source.write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    code, stdout, stderr = cli(capsys, "flower", "local", str(source), "--out", str(out),
                               "--secure", "--clients", str(CLIENTS))
    assert code == 0, stdout + stderr
    assert "fedavg: mean accuracy" in stdout
    assert_same_run(json.loads((out / "summary.json").read_text()), expected)
    link_log = (out / "flower" / "logs" / "superlink.log").read_text()
    assert "--insecure" not in link_log and (out / "flower" / "certs" / "ca.crt").exists()
    node_log = (out / "flower" / "logs" / "supernode-0.log").read_text()
    assert "--insecure" not in node_log
    # Each node's messages ran in its long-lived worker, which signed its task claims.
    assert "Start `flwr-clientapp` process" not in node_log
    worker_log = (out / "flower" / "logs" / "clientapp-0.log").read_text()
    assert READY in worker_log and "stopped after" in worker_log
    assert (out / "flower" / "keys" / "superexec-secret").exists()
    assert processes_mentioning(str(out / "flower")) == []


def test_flowers_own_process_per_message_gives_the_same_run(tmp_path):
    from clusterfed.flower.launch import run_local

    # A new ClientApp process for each message: the clients' Adam moments, kept between
    # rounds (train.optimizer_state=kept), survive only in Flower's context.state.
    config = cfg.resolve(flower_config({"name": "fedavg"}, rounds=3),
                         ["train.optimizer=adam", "train.optimizer_state=kept",
                          "train.lr=0.003", "train.momentum=0"])
    expected = run_config(config)
    fresh = run_config(cfg.resolve(config, ["train.optimizer_state=fresh"]))
    assert fresh["final"]["per_client_accuracy"] != expected["final"]["per_client_accuracy"]
    got = run_local(config, tmp_path / "run", isolation="subprocess", echo=lambda line: None)
    assert_same_run(got, expected)
    logs = tmp_path / "run" / "flower" / "logs"
    assert "Start `flwr-clientapp` process" in (logs / "supernode-0.log").read_text()
    assert not list(logs.glob("clientapp-*.log"))
    assert processes_mentioning(str(tmp_path / "run" / "flower")) == []


def test_the_simulation_runtime_runs_the_same_app_with_the_same_result(tmp_path):
    pytest.importorskip("ray", reason="Flower's simulation runtime needs the simulation extra: "
                        "pip install -c constraints.txt -e '.[flower,simulation]'")
    from clusterfed.flower.launch import run_local

    config = flower_config(FLOWER_ALGORITHMS[1])   # CFL
    expected = run_config(config)
    got = run_local(config, tmp_path / "run", simulation=True, client_cpus=1,
                    echo=lambda line: None)
    assert_same_run(got, expected)
    assert processes_mentioning(str(tmp_path / "run" / "flower")) == []
