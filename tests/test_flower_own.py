"""Own data and client-held secrets on the Flower runtime, in one process (tests/flower_grid.py):
the hello check, refusing a node that does not fit, the initial-model query, and that the server
side never opens a node's data or secret. The real-process runs are in
test_flower_own_network.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed: the Flower runtime tests need "
                    "pip install -c constraints.txt -e '.[test,flower]'")

from flower_cases import CLIENTS, flower_config  # noqa: E402
from flower_grid import LoopbackGrid  # noqa: E402
from flwr.common.config import parse_config_args  # noqa: E402
from helpers import cli, comparable  # noqa: E402
from own_folders import (  # noqa: E402
    own_config,
    scenario_federation,
    watch_opens,
    write_client_folders,
)
from test_flower_runtime import FakeClock, untimed  # noqa: E402

from clusterfed.client.privacy import ParameterTransform  # noqa: E402
from clusterfed.client.secret import new_secret_file, secret_id  # noqa: E402
from clusterfed.data.scenarios import Federation  # noqa: E402
from clusterfed.errors import ClusterfedError, ConfigError  # noqa: E402
from clusterfed.flower import membership, node, wire  # noqa: E402
from clusterfed.flower.executor import FlowerExecutor  # noqa: E402
from clusterfed.flower.launch import own_data_config, run_config_for  # noqa: E402
from clusterfed.flower.local import LocalFederation  # noqa: E402
from clusterfed.flower.server_app import run_experiment  # noqa: E402
from clusterfed.run_folder import read_jsonl  # noqa: E402
from clusterfed.sim.simulation import Simulation, run_config  # noqa: E402

CFL = {"name": "cfl", "acceptance": "fixed", "eps1": 0.6, "eps2": 0.1}
IFCA = {"name": "ifca", "k": 2, "restarts": 1, "initialisation": "random"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    """client-0..3 of the small label-swap federation, one .npz each."""
    root = tmp_path_factory.mktemp("own") / "federation"
    write_client_folders(scenario_federation(CFL), root)
    return root


def own_grid(root: Path, secret: Path | None = None, paths: dict[int, Path] | None = None,
             secrets: dict[int, Path] | None = None) -> LoopbackGrid:
    """One node per client folder; `paths` / `secrets` replace some nodes' folder or file."""
    grid = LoopbackGrid([])
    for k in range(CLIENTS):
        config = {"num-partitions": CLIENTS,
                  "data-path": str((paths or {}).get(k, root / f"client-{k}"))}
        chosen = (secrets or {}).get(k, secret)
        if chosen is not None:
            config["privacy-secret-file"] = str(chosen)
        grid.add_node(k, config)
    return grid


def joined(grid: LoopbackGrid, config: dict) -> FlowerExecutor:
    clock = FakeClock()
    executor = FlowerExecutor(grid, config, clock=clock, sleep=clock.sleep, join_timeout=5.0)
    executor.join()
    return executor


def serve(grid: LoopbackGrid, config: dict, out: Path) -> dict:
    """The ServerApp's body on the loopback grid."""
    return run_experiment(grid, run_config_for(config, out), report=False)


# The hello check -------------------------------------------------------------------------------

def facts(**changes: object) -> dict:
    return {"partition": 1, "num_clients": 4, "num_train": 30, "num_test": 10,
            "true_cluster": -1, "input_shape": [1, 8, 8], "classes": [0, 1, 2],
            "privacy_secret_id": "", **changes}


def test_the_hello_check_names_what_does_not_fit():
    expected = membership.Expected(clients=4, input_shape=(1, 8, 8), n_classes=10)
    reference = membership.Reference((1, 8, 8), 10, "")

    def check(**changes: object) -> str | None:
        return membership.hello_problem(facts(**changes), expected, reference)

    assert check() is None
    assert check(input_shape=[3, 8, 8]) == ("inputs shaped [3, 8, 8], the federation's are "
                                            "[1, 8, 8]")
    assert check(classes=[0, 12]) == "label 12 outside the federation's 10 classes"
    assert check(num_train=0) == "no training samples"
    assert check(partition=4) == "partition-id=4 is outside the federation's 4 clients (0..3)"
    assert check(num_clients=5) == "num-partitions=5, the federation has 4 clients"
    assert check(problem="cannot read the data") == "cannot read the data"
    # A scenario node also says its federation's class count.
    assert check(n_classes=12) == "12 classes, the federation has 10"
    private = membership.Expected(clients=4, input_shape=(1, 8, 8), n_classes=10,
                                  privacy=True)
    keyed = membership.Reference((1, 8, 8), 10, "aa")
    assert membership.hello_problem(facts(privacy_secret_id="aa"), private, keyed) is None
    assert "holds no privacy secret file" in membership.hello_problem(facts(), private, keyed)
    assert "another privacy secret" in membership.hello_problem(
        facts(privacy_secret_id="bb"), private, keyed)
    # Without privacy a node's secret is not looked at.
    assert membership.hello_problem(facts(privacy_secret_id="bb"), expected, keyed) is None


def test_admission_takes_what_the_config_leaves_open_from_most_nodes():
    # A scenario run names no shape: most nodes' shape is the federation's.
    expected = membership.Expected(clients=4)
    heard = {p: facts(partition=p, n_classes=10) for p in range(4)}
    heard[1] = facts(partition=1, n_classes=10, input_shape=[3, 8, 8])
    admission = membership.admit(heard, expected)
    assert admission.members == (0, 2, 3)
    assert admission.refused == {1: "inputs shaped [3, 8, 8], the federation's are [1, 8, 8]"}
    assert admission.reference == membership.Reference((1, 8, 8), 10, "")
    # A seed in the run config while the nodes hold secrets: the run is refused, not a node.
    private = membership.Expected(clients=4, input_shape=(1, 8, 8), n_classes=10, privacy=True,
                                  privacy_seed=True)
    keyed = {p: facts(partition=p, privacy_secret_id="aa") for p in range(4)}
    with pytest.raises(ClusterfedError, match="run.privacy_seed"):
        membership.admit(keyed, private)


def test_a_flower_run_over_own_data_names_the_agreement_and_no_secret(tmp_path):
    config = own_config(CFL)
    assert membership.expected_from_config(config) == membership.Expected(
        clients=CLIENTS, input_shape=(1, 8, 8), n_classes=10)
    del config["data"]["n_classes"]
    with pytest.raises(ConfigError, match="data.n_classes and data.input_shape"):
        membership.expected_from_config(config)
    secret = own_config(CFL, privacy="permutation", privacy_secret_file=str(tmp_path / "s"))
    with pytest.raises(ConfigError, match="privacy-secret-file"):
        membership.expected_from_config(secret)
    # The server refuses before it says hello to anyone, let alone reads anything.
    grid = own_grid(tmp_path)
    with pytest.raises(ConfigError, match="privacy-secret-file"):
        serve(grid, secret, tmp_path / "run")
    assert grid.pushed == 0


# The node -------------------------------------------------------------------------------------

def test_an_own_data_node_describes_its_data_and_no_truth(folders, tmp_path):
    key = new_secret_file(tmp_path / "s")
    config = own_config(CFL, privacy="permutation")
    served = node.node_for(wire.config_json(config), {
        "partition-id": 2, "num-partitions": 4, "data-path": str(folders / "client-2"),
        "privacy-secret-file": str(key)})
    described = served.describe()
    with np.load(folders / "client-2" / "data.npz") as data:
        assert described["num_train"] == len(data["y_train"])
        assert described["num_test"] == len(data["y_test"])
        assert described["classes"] == sorted({int(v) for v in data["y_train"]}
                                              | {int(v) for v in data["y_test"]})
    assert described["true_cluster"] == -1
    assert described["input_shape"] == [1, 8, 8]
    assert (described["partition"], described["num_clients"]) == (2, 4)
    assert described["privacy_secret_id"] == secret_id(key.read_bytes())
    text = json.dumps(described)
    assert str(folders) not in text and key.read_bytes().hex() not in text


def test_a_node_whose_data_cannot_be_read_says_why_without_its_path(tmp_path):
    config = own_config(CFL)
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    grid = LoopbackGrid([])
    grid.add_node(0, {"data-path": str(empty)})
    executor = FlowerExecutor(grid, config, join_timeout=2.0, clock=(clock := FakeClock()),
                              sleep=clock.sleep)
    with pytest.raises(ClusterfedError, match="<data-path> is empty: no client data") as caught:
        executor.join()
    assert str(empty) not in str(caught.value)


# Runs over own data ----------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm, privacy", [(CFL, "none"), (CFL, "permutation"),
                                                (IFCA, "signed_permutation")],
                         ids=["cfl", "cfl-permutation", "ifca-signed"])
def test_own_data_nodes_reproduce_the_simulator_on_the_same_folders(folders, tmp_path,
                                                                    algorithm, privacy):
    key = new_secret_file(tmp_path / "s") if privacy != "none" else None
    in_process = own_config(algorithm, root=folders, privacy=privacy,
                            privacy_secret_file=key and str(key))
    expected = run_config(in_process, tmp_path / "sim")
    got = serve(own_grid(folders, secret=key), own_config(algorithm, privacy=privacy),
                tmp_path / "flower")
    assert comparable(got) == comparable(expected)
    for name in ("metrics.jsonl", "events.jsonl"):
        assert untimed(read_jsonl(tmp_path / "flower" / name)) == \
            untimed(read_jsonl(tmp_path / "sim" / name))


def test_a_node_that_does_not_fit_is_refused_and_the_run_goes_on_with_the_others(folders,
                                                                                  tmp_path):
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    rng = np.random.default_rng(0)
    np.savez(wrong / "data.npz", x=rng.random((40, 3, 8, 8), dtype=np.float32),
             y=rng.integers(0, 10, 40))
    grid = own_grid(folders, paths={2: wrong})
    got = serve(grid, own_config(CFL), tmp_path / "flower")
    events = read_jsonl(tmp_path / "flower" / "events.jsonl")
    assert [e for e in events if e["type"] == "node_refused"] == [
        {"round": 0, "type": "node_refused", "partition": 2, "node": grid.node_of(2),
         "reason": "inputs shaped [3, 8, 8], the federation's are [1, 8, 8]"}]
    assert {"round": 0, "type": "members", "partitions": [0, 1, 3]} in events
    # The federation is the clients that fit, numbered in partition order: the simulator on
    # their folders gives the same run, per-(round, step, client) generators included.
    three = tmp_path / "three"
    write_client_folders(scenario_federation(CFL), three, [0, 1, 3])
    expected = run_config(own_config(CFL, root=three), tmp_path / "sim")
    assert comparable(got) == comparable(expected)
    assert untimed(read_jsonl(tmp_path / "flower" / "metrics.jsonl")) == \
        untimed(read_jsonl(tmp_path / "sim" / "metrics.jsonl"))
    assert [e for e in events if e["round"] > 0] == read_jsonl(tmp_path / "sim" / "events.jsonl")


def test_a_refused_scenario_node_leaves_the_others_numbered_as_the_simulator_would(tmp_path):
    # Scenario nodes too: client 1's node was started for another federation size.
    config = flower_config({"name": "fedavg"}, rounds=2)
    grid = LoopbackGrid([0, 2, 3])
    grid.add_node(1, {"num-partitions": 5})
    got = serve(grid, config, tmp_path / "flower")
    refused = [e for e in read_jsonl(tmp_path / "flower" / "events.jsonl")
               if e["type"] == "node_refused"]
    assert [(e["partition"], e["reason"]) for e in refused] == [
        (1, "node config num-partitions=5 differs from the scenario's 4 clients")]
    full = scenario_federation({"name": "fedavg"})
    kept = [0, 2, 3]
    three = Federation([full.clients[c] for c in kept], full.true_clusters[kept],
                       full.n_classes, full.input_shape, full.info)
    expected = run_config(config, tmp_path / "sim", federation=three)
    assert comparable(got) == comparable(expected)


def test_a_node_with_another_secret_or_none_is_refused(folders, tmp_path):
    key, other = new_secret_file(tmp_path / "a"), new_secret_file(tmp_path / "b")
    grid = own_grid(folders, secret=key, secrets={1: other})
    del grid.node_configs[grid.node_of(3)]["privacy-secret-file"]
    executor = joined(grid, own_config(CFL, privacy="permutation"))
    assert executor.partitions == [0, 2]
    reasons = {e["partition"]: e["reason"] for e in executor.drain_events()
               if e["type"] == "node_refused"}
    assert reasons == {1: "holds another privacy secret than the federation's nodes",
                       3: "holds no privacy secret file; the federation's nodes do"}


def test_a_run_config_seed_is_refused_when_the_nodes_hold_secrets(folders, tmp_path):
    key = new_secret_file(tmp_path / "s")
    config = own_config(CFL, privacy="permutation", privacy_seed=7)
    with pytest.raises(ClusterfedError, match="run.privacy_seed"):
        joined(own_grid(folders, secret=key), config)


# The initial models and the secret -------------------------------------------------------------

def test_the_initial_models_come_from_a_node_in_p_space(folders, tmp_path):
    key = new_secret_file(tmp_path / "s")
    grid = own_grid(folders, secret=key)
    executor = joined(grid, own_config(IFCA, privacy="permutation"))
    assert executor.node_secrets
    first, draw = executor.initial_models()
    local = Simulation(own_config(IFCA, root=folders, privacy="permutation",
                                  privacy_secret_file=str(key)))
    np.testing.assert_array_equal(first, local.setup.initial_params)
    pushed = grid.pushed
    np.testing.assert_array_equal(draw(1), local.setup.draw_initial(1))
    np.testing.assert_array_equal(draw(1), local.setup.draw_initial(1))
    assert grid.pushed == pushed + 1          # one query per draw, then remembered
    transform = ParameterTransform.from_secret("permutation", key.read_bytes(), first.size)
    assert not np.array_equal(transform.inverse(first), first)
    # Without client-held secrets the server computes them itself, as in-process.
    assert not joined(own_grid(folders), own_config(IFCA, privacy="permutation")).node_secrets


def test_the_server_side_never_opens_a_nodes_data_or_secret(folders, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    key = new_secret_file(site / "federation.secret")
    grid = own_grid(folders, secret=key)
    config = own_config(CFL, privacy="permutation")
    out = tmp_path / "run"
    with watch_opens([folders, site], lambda: grid.serving) as opened:
        # The nodes run in this process too: what they open while serving is theirs.
        serve(grid, config, out)
        server_side = [path for path, serving in opened if not serving]
        node_side = [path for path, serving in opened if serving]
    assert server_side == []
    assert str(key) in node_side and any(str(folders) in p for p in node_side)
    written = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    for secret_text in (key.read_bytes(), key.read_bytes().hex().encode(), str(key).encode(),
                        str(site).encode(), str(folders).encode()):
        assert secret_text not in written


# clusterfed flower local --own-data -----------------------------------------------------------

def test_flower_local_gives_each_node_its_folder_and_the_secret(tmp_path):
    sites = [tmp_path / "own" / f"client-{k}" for k in range(2)]
    federation = LocalFederation(2, tmp_path / "work", own_data=sites,
                                 secret_file=tmp_path / "s")
    for k in range(2):
        argv = federation.node_argv(k)
        given = parse_config_args([argv[argv.index("--node-config") + 1]])
        assert given == {"partition-id": k, "num-partitions": 2, "data-path": str(sites[k]),
                         "privacy-secret-file": str(tmp_path / "s")}


def test_flower_local_own_data_config_names_the_agreement_and_no_root(folders):
    base = flower_config(CFL)
    config = own_data_config(base, folders)
    assert config["data"] == {"dataset": "folders", "n_classes": 10, "input_shape": [1, 8, 8]}
    assert membership.expected_from_config(config).clients == CLIENTS
    assert config["scenario"]["clients"] == CLIENTS
    assert config["algorithm"] == base["algorithm"] and config["train"] == base["train"]
    assert str(folders) not in json.dumps(config)


def test_flower_local_refuses_a_secret_without_privacy_or_in_the_run_config(folders, tmp_path,
                                                                            capsys):
    key = new_secret_file(tmp_path / "s")
    code, _, err = cli(capsys, "flower", "local", "--own-data", str(folders), "--secret-file",
                       str(key), "--out", str(tmp_path / "a"))
    assert code == 2 and "run.privacy=permutation" in err
    code, _, err = cli(capsys, "flower", "local", "quickstart", "--own-data", str(folders),
                       "run.privacy=permutation", f"run.privacy_secret_file={key}",
                       "--out", str(tmp_path / "b"))
    assert code == 2 and "--secret-file" in err
    assert not (tmp_path / "a" / "flower").exists() and not (tmp_path / "b" / "flower").exists()
