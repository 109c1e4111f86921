"""The Flower runtime in one process: wire format, executor, ServerApp and ClientApp over an
in-process Grid (tests/flower_grid.py). The real SuperLink/SuperNode runs are in
test_flower_network.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: the Flower runtime tests need "
                    "pip install -c constraints.txt -e '.[test,flower]'")

import tomli  # noqa: E402
from flower_cases import CLIENTS, EVERY_ALGORITHM, case_id, flower_config  # noqa: E402
from flower_grid import LoopbackGrid  # noqa: E402
from flwr.app import Array, Message  # noqa: E402
from helpers import comparable  # noqa: E402

from clusterfed import config as cfg  # noqa: E402
from clusterfed.errors import ClusterfedError  # noqa: E402
from clusterfed.flower import node, wire  # noqa: E402
from clusterfed.flower.app import APP_TOML  # noqa: E402
from clusterfed.flower.executor import FlowerExecutor  # noqa: E402
from clusterfed.flower.launch import run_config_for  # noqa: E402
from clusterfed.flower.server_app import run_experiment  # noqa: E402
from clusterfed.run_folder import read_jsonl  # noqa: E402
from clusterfed.sim.simulation import Simulation, run_config  # noqa: E402
from clusterfed.tasks import (  # noqa: E402
    ClientResult,
    ClientTask,
    LossSpec,
    SignatureSpec,
    TaskKind,
    TrainSpec,
)

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    """Time that passes only when the executor sleeps: timeouts without waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def executor_for(grid: LoopbackGrid, config: dict, **kw: float) -> FlowerExecutor:
    clock = FakeClock()
    executor = FlowerExecutor(grid, config, clock=clock, sleep=clock.sleep, **kw)
    executor.join()
    return executor


def flower_run(config: dict, grid: LoopbackGrid, out: Path | None = None, callbacks=(),
               after_join=None, **kw: float) -> tuple[dict, FlowerExecutor]:
    executor = executor_for(grid, config, **kw)
    if after_join is not None:
        after_join()
    sim = Simulation(config, out, federation=executor.federation(), executor=executor,
                     callbacks=callbacks)
    return sim.run(), executor


# The wire -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(TaskKind))
@pytest.mark.parametrize("rows", [None, 3])
def test_every_task_kind_crosses_the_wire_unchanged(kind, rows):
    rng = np.random.default_rng(0)
    params = rng.normal(size=(rows, 7) if rows else 7).astype(np.float32)
    spec = TrainSpec(lr=0.1, batch_size=4, epochs=None, steps=3, momentum=0.5)
    typed = {TaskKind.TRAIN: {"train": spec, "own_model": False},
             TaskKind.SIGNATURE: {"signature": SignatureSpec(p=2, per_class=False, center=True,
                                                             mean=(0.5, 0.25), std=(2.0, 1.0),
                                                             svd="randomized", seed=3,
                                                             budget=50)},
             TaskKind.LOSSES: {"loss": LossSpec("train+test", max_samples=7)},
             TaskKind.EVALUATE: {"split": "validation"}}.get(kind, {})
    task = ClientTask(5, kind, params, meta={"cluster": 2, "tag": "left", "weight": 0.25,
                                             "fresh": True, "np": np.int64(4)}, id=9, **typed)
    back, r, step, text = wire.decode_task(wire.encode_task(task, 7, 1, '{"a": 1}'))
    assert (r, step, text) == (7, 1, '{"a": 1}')
    assert back.kind is kind and back.client == 5 and back.train == task.train
    assert back.id == 9
    for name in ("own_model", "signature", "loss", "split"):
        assert getattr(back, name) == getattr(task, name), name
    assert back.params.dtype == np.float32 and np.array_equal(back.params, params)
    assert back.meta == {"cluster": 2, "tag": "left", "weight": 0.25, "fresh": True, "np": 4}


def test_results_cross_the_wire_with_every_field():
    result = ClientResult(3, TaskKind.EVALUATE, 40, update=np.arange(4, dtype=np.float32),
                          loss=float("nan"), losses=np.array([0.5, 1.5]),
                          accuracies=np.array([0.9, 0.1]), meta={"cluster": 1},
                          task_id=17)
    back = wire.decode_result(wire.encode_result(result))
    for f in dataclasses.fields(ClientResult):
        a, b = getattr(result, f.name), getattr(back, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        elif isinstance(a, float) and np.isnan(a):
            assert np.isnan(b)
        else:
            assert a == b, f.name


def test_replies_with_wrong_shapes_or_nan_are_named():
    task = ClientTask(1, TaskKind.TRAIN, np.zeros(6, np.float32), TrainSpec(lr=0.1, batch_size=2))
    ok = ClientResult(1, TaskKind.TRAIN, 10, update=np.ones(6, np.float32), loss=0.3)
    assert wire.check_result(task, ok) is None
    short = dataclasses.replace(ok, update=np.ones(5, np.float32))
    assert "wrong shape: update (5,), expected (6,)" in wire.check_result(task, short)
    nan = dataclasses.replace(ok, update=np.array([np.nan] * 6, np.float32))
    assert "NaN" in wire.check_result(task, nan)
    other = dataclasses.replace(ok, client=2)
    assert "not client 1" in wire.check_result(task, other)
    assert "not task -1" in wire.check_result(task, dataclasses.replace(ok, task_id=4))
    losses = ClientTask(1, TaskKind.LOSSES, np.zeros((3, 6), np.float32))
    two = ClientResult(1, TaskKind.LOSSES, 10, losses=np.ones(2))
    assert "expected (3,)" in wire.check_result(losses, two)


# The executor against the in-process simulator ----------------------------------------------

def test_kept_optimizer_states_live_in_the_nodes_context_and_match_the_simulator(tmp_path):
    # Each node keeps its client's Adam moments in Flower's context.state between rounds.
    config = cfg.resolve(flower_config({"name": "fedavg"}, rounds=3),
                         ["train.optimizer=adam", "train.optimizer_state=kept",
                          "train.lr=0.003", "train.momentum=0"])
    expected = run_config(config, tmp_path / "sim")
    grid = LoopbackGrid(range(CLIENTS))
    got, _ = flower_run(config, grid, tmp_path / "flower")
    assert comparable(got) == comparable(expected)
    assert all(wire.OPTIMIZER_STATE in state.array_records for state in grid.states.values())
    fresh = run_config(cfg.resolve(config, ["train.optimizer_state=fresh"]), tmp_path / "fresh")
    assert comparable(fresh) != comparable(expected)


@pytest.mark.parametrize("algorithm", EVERY_ALGORITHM, ids=case_id)
def test_flower_executor_reproduces_the_simulator_exactly(algorithm, tmp_path):
    config = flower_config(algorithm)
    expected = run_config(config, tmp_path / "sim")
    got, _ = flower_run(config, LoopbackGrid(range(CLIENTS)), tmp_path / "flower")
    assert comparable(got) == comparable(expected)
    for name in ("metrics.jsonl", "events.jsonl"):
        assert untimed(read_jsonl(tmp_path / "flower" / name)) == \
            untimed(read_jsonl(tmp_path / "sim" / name))


def test_sampled_local_is_weighted_by_test_sizes_as_in_the_simulator(tmp_path):
    # The protocol weights each sampled client's accuracy by its test samples, which only
    # the nodes hold: quantity skew makes them unequal.
    config = flower_config({"name": "fedavg"}, rounds=2, every=1)
    config["scenario"]["quantity_skew"] = 1.0
    config["eval"]["protocol"] = "sampled_local"
    sim = Simulation(config, tmp_path / "sim")
    assert len({len(c.test_y) for c in sim.federation.clients}) == CLIENTS
    sim.run()
    flower_run(config, LoopbackGrid(range(CLIENTS)), tmp_path / "flower")
    expected = read_jsonl(tmp_path / "sim" / "metrics.jsonl")
    got = read_jsonl(tmp_path / "flower" / "metrics.jsonl")
    assert [m["mean_accuracy"] for m in got] == [m["mean_accuracy"] for m in expected]
    assert untimed(got) == untimed(expected)


def untimed(records: list[dict]) -> list[dict]:
    """Records without wall-clock figures (LCFL logs its clients' seconds)."""
    return [{k: v for k, v in r.items() if "seconds" not in k} for r in records]


def test_a_silent_node_is_left_out_logged_and_its_restart_rejoins(tmp_path):
    config = flower_config({"name": "fedavg"}, rounds=3, every=1)
    grid = LoopbackGrid(range(CLIENTS))

    def crash() -> None:          # the SuperNode of client 2 dies after joining
        grid.silent.add(grid.node_of(2))

    def restart_after_round_2(done: int, record: dict) -> None:
        if done == 2:
            grid.add_node(2)      # a restarted SuperNode: a new node id, the same partition

    summary, _ = flower_run(config, grid, tmp_path, callbacks=[restart_after_round_2],
                            after_join=crash, reply_timeout=5.0)
    events = read_jsonl(tmp_path / "events.jsonl")
    missing = [(e["round"], e["task"]) for e in events
               if e["type"] == "missing_client" and e["client"] == 2]
    # Round 1: the training task times out and the node is dropped; from then on until it
    # rejoins, client 2 has no node (its evaluation and round 2 are missing at once).
    assert (1, "train") in missing and (2, "train") in missing
    assert all(r <= 2 for r, _ in missing)
    assert any(e["type"] == "client_joined" and e["client"] == 2 and e["round"] == 3
               for e in events)
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    # Not evaluated: null in the strict JSON of metrics.jsonl.
    assert metrics[0]["unevaluated_clients"] == [2]
    assert metrics[0]["per_client_accuracy"][2] is None
    assert "unevaluated_clients" not in metrics[2]
    assert summary["final"]["per_client_accuracy"][2] >= 0.0


@pytest.mark.parametrize("algorithm", [{"name": "fedavg_ft"}, {"name": "per_fedavg"}],
                         ids=case_id)
def test_a_silent_node_is_not_scored_by_test_time_adaptation(algorithm, tmp_path):
    # The adaptation's TRAIN result of client 2 never comes: it is left out, not a crash.
    config = flower_config(algorithm, rounds=1)
    grid = LoopbackGrid(range(CLIENTS))
    summary, _ = flower_run(config, grid, tmp_path, reply_timeout=5.0,
                            after_join=lambda: grid.silent.add(grid.node_of(2)))
    record = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert record["unevaluated_clients"] == [2]
    assert record["per_client_accuracy"][2] is None
    assert np.isfinite(record["mean_accuracy"]) and np.isfinite(record["served_mean_accuracy"])
    assert np.isfinite(summary["final"]["mean_accuracy"])


def test_replies_with_a_wrong_shape_or_nan_are_rejected_and_logged(tmp_path):
    config = flower_config({"name": "fedavg"}, rounds=1)
    grid = LoopbackGrid(range(CLIENTS))

    def shorten(reply: Message) -> Message:
        arrays = reply.content.array_records.get(wire.ARRAYS, {})
        if "update" in arrays:
            arrays["update"] = Array(arrays["update"].numpy()[:-1])
        return reply

    def poison(reply: Message) -> Message:
        arrays = reply.content.array_records.get(wire.ARRAYS, {})
        if "update" in arrays:
            update = arrays["update"].numpy().copy()
            update[0] = np.nan
            arrays["update"] = Array(update)
        return reply

    grid.tamper[grid.node_of(1)] = shorten
    grid.tamper[grid.node_of(3)] = poison
    summary, _ = flower_run(config, grid, tmp_path)
    rejected = {e["client"]: e["reason"] for e in read_jsonl(tmp_path / "events.jsonl")
                if e["type"] == "rejected_result"}
    assert set(rejected) == {1, 3}
    assert "wrong shape" in rejected[1] and "NaN" in rejected[3]
    assert np.isfinite(summary["final"]["mean_accuracy"])


def test_a_node_of_another_federation_cannot_join():
    grid = LoopbackGrid([0, 1, 2, 7])          # partition 7 does not exist among 4 clients
    clock = FakeClock()
    executor = FlowerExecutor(grid, flower_config({"name": "fedavg"}), join_timeout=3.0,
                              clock=clock, sleep=clock.sleep)
    with pytest.raises(ClusterfedError, match="partition-id=7 is outside"):
        executor.join()
    assert grid.pushed == 4          # one hello per node: a node that failed is not asked again


# The node ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("device, cuda, expected", [
    ("cpu", True, "cpu"), ("auto", False, "cpu"), ("auto", True, "cuda"),
    ("cuda:1", True, "cuda:1")])
def test_a_node_computes_on_the_configured_device(monkeypatch, device, cuda, expected):
    # No GPU here: CUDA's availability is faked and the executor only records its device.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    chosen = []
    monkeypatch.setattr(node, "ClientRuntime", lambda *args, device="cpu", **kw:
                        chosen.append(torch.device(device)))
    config = flower_config({"name": "fedavg"})
    config["run"]["device"] = device
    node.Population.build(config)
    assert chosen == [torch.device(expected)]


# The ServerApp's body: resume after a crash ---------------------------------------------------

def test_the_server_app_resumes_after_a_crash_with_the_same_numbers(tmp_path):
    config = flower_config({"name": "cfl", "eps1": 0.6, "eps2": 0.1}, every=1)
    expected = run_config(config, tmp_path / "sim")
    crashing = LoopbackGrid(range(CLIENTS))
    crashing.fail_after = CLIENTS + 2 * CLIENTS + 2   # hellos, round 1, then mid-round 2
    with pytest.raises(ConnectionError):
        run_experiment(crashing, run_config_for(config, tmp_path / "flower"), report=False)
    assert [m["round"] for m in read_jsonl(tmp_path / "flower" / "metrics.jsonl")] == [1]
    resumed = run_experiment(LoopbackGrid(range(CLIENTS)),
                             run_config_for(config, tmp_path / "flower", resume=True),
                             report=False)
    assert comparable(resumed) == comparable(expected)
    assert read_jsonl(tmp_path / "flower" / "metrics.jsonl") == read_jsonl(
        tmp_path / "sim" / "metrics.jsonl")
    assert read_jsonl(tmp_path / "flower" / "events.jsonl") == read_jsonl(
        tmp_path / "sim" / "events.jsonl")


# The app folder --------------------------------------------------------------------------------

def test_the_example_app_is_the_app_the_cli_submits():
    example = (REPO / "examples" / "flower" / "pyproject.toml").read_text()
    assert example == APP_TOML
    app = tomli.loads(example)["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "clusterfed.flower.server_app:app",
                                 "clientapp": "clusterfed.flower.client_app:app"}
    assert set(run_config_for(flower_config({"name": "fedavg"}), Path("x"))) <= set(
        app["config"])
