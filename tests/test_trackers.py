"""run.loggers and `clusterfed export`: each tracker's logs, read back with its own library's
reader, equal metrics.jsonl; a resumed run logs each step once."""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from clusterfed import config as cfg
from clusterfed.cli import main
from clusterfed.errors import ConfigError
from clusterfed.run_folder import read_jsonl
from clusterfed.sim.simulation import resume_run, run_config
from clusterfed.trackers.records import latest_assignment, round_scalars

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "docs" / "reproductions" / "runs" / "pacfl-labelskew20-fmnist" / "fedavg" / "seed-0"
CHECKED = ("mean_accuracy", "mean_loss", "train_loss", "n_clusters", "ari", "nmi")


def config(loggers: list[str], **run: Any) -> dict[str, Any]:
    return cfg.resolve("quickstart", [
        "algorithm.name=ifca", "train.rounds=4", "train.local_epochs=1", "eval.every=2",
        "run.checkpoint_every=2", "run.threads=1", "run.progress=false",
        f"run.loggers=[{','.join(loggers)}]",
        *(f"run.{k}={v}" for k, v in run.items())])


def expected(folder: Path) -> dict[int, dict[str, float]]:
    """Round -> the figures metrics.jsonl and events.jsonl give it."""
    events = read_jsonl(folder / "events.jsonl")
    out, assignment = {}, None
    for record in read_jsonl(folder / "metrics.jsonl"):
        assignment = latest_assignment([e for e in events if e["round"] == record["round"]],
                                       assignment)
        evaluated = "mean_accuracy" in record
        out[record["round"]] = round_scalars(record, assignment if evaluated else None)
    return out


def test_round_scalars_flattens_figures_and_counts_cluster_sizes() -> None:
    record = {"round": 3, "sampled": 4, "train_loss": 0.5, "mean_accuracy": 0.75, "ari": None,
              "per_client_accuracy": [0.5, 1.0, 0.5, 1.0],
              "per_cluster_accuracy": {"0": 0.5, "1": 1.0},
              "separation_gap": {"split": {"a": 0.25}}}
    assert round_scalars(record, [1, 0, 1, 1]) == {
        "sampled": 4.0, "train_loss": 0.5, "mean_accuracy": 0.75,
        "per_cluster_accuracy/0": 0.5, "per_cluster_accuracy/1": 1.0,
        "separation_gap/split/a": 0.25, "cluster_size/0": 1.0, "cluster_size/1": 3.0}


def test_a_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)   # import mlflow raises ImportError
    with pytest.raises(ConfigError) as err:
        run_config(config(["mlflow"]), tmp_path / "run")
    message = str(err.value)
    assert "\n" not in message and "pip install 'clusterfed[mlflow]'" in message
    with pytest.raises(ConfigError, match="run.loggers"):
        cfg.resolve("quickstart", ["run.loggers=[neptune]"])


# TensorBoard ---------------------------------------------------------------------------------

def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = tensorboard_reader(logdir)
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def tensorboard_reader(logdir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0,
                                                               "tensors": 0})
    accumulator.Reload()
    return accumulator


def by_step(series: dict[str, list[tuple[int, float]]]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for tag, points in series.items():
        for step, value in points:
            assert tag not in out.setdefault(step, {}), f"{tag} logged twice at step {step}"
            out[step][tag] = value
    return out


def assert_equal(logged: dict[int, dict[str, float]], folder: Path, sizes: bool = True) -> None:
    """`sizes`: the folder has events.jsonl, whose assignments give the clusters' sizes."""
    want = expected(folder)
    assert sorted(logged) == sorted(want)
    for step, values in want.items():
        assert set(values) <= set(logged[step])
        for tag, value in values.items():
            assert logged[step][tag] == pytest.approx(value, rel=1e-6), (step, tag)
    assert all(name in want[max(want)] for name in CHECKED) and len(want) > 1
    assert any(t.startswith("per_cluster_accuracy/") for t in want[max(want)])
    assert any(t.startswith("cluster_size/") for t in want[max(want)]) == sizes


def test_tensorboard_logs_equal_metrics_and_continue_on_resume(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed: "
                        "pip install 'clusterfed[tensorboard]'")
    folder = tmp_path / "run"
    cut_off_after_round_3(config(["tensorboard"]), folder)
    resume_run(folder)
    assert_equal(by_step(tensorboard_scalars(folder / "tensorboard")), folder)
    reader = tensorboard_reader(folder / "tensorboard")
    assert {"figures/accuracy", "figures/per_client", "figures/clusters"} <= set(
        reader.Tags()["images"])
    texts = reader.Tags()["tensors"]
    assert "events/text_summary" in texts and "config/text_summary" in texts


class CutOff(Exception):
    pass


def cut_off_after_round_3(run_cfg: dict[str, Any], folder: Path) -> None:
    """Round 3 logged, the checkpoint at round 2: the resumed run reruns round 3."""
    def stop(completed: int, record: Any) -> None:
        if completed == 4:
            raise CutOff

    with pytest.raises(CutOff):
        run_config(run_cfg, folder, callbacks=[stop])
    assert [r["round"] for r in read_jsonl(folder / "metrics.jsonl")] == [1, 2, 3]


# MLflow --------------------------------------------------------------------------------------

@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed: "
                        "pip install 'clusterfed[mlflow]'")
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return mlflow.MlflowClient()


def mlflow_logged(client: Any, run_id: str) -> dict[int, dict[str, float]]:
    run = client.get_run(run_id)
    series = {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
              for key in run.data.metrics}
    return by_step(series)


def test_mlflow_logs_equal_metrics_and_continue_the_run_id(tmp_path: Path,
                                                           mlflow_store: Any) -> None:
    folder = tmp_path / "run"
    cut_off_after_round_3(config(["mlflow"], experiment="exp"), folder)
    resume_run(folder)
    runs = mlflow_store.search_runs([mlflow_store.get_experiment_by_name("exp").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "run"
    assert runs[0].info.status == "FINISHED"
    assert_equal(mlflow_logged(mlflow_store, runs[0].info.run_id), folder)
    assert runs[0].data.params["algorithm.name"] == "ifca"
    assert runs[0].data.params["train.rounds"] == "4"
    artifacts = {a.path for a in mlflow_store.list_artifacts(runs[0].info.run_id, "figures")}
    assert artifacts == {"figures/accuracy.png", "figures/per_client.png", "figures/clusters.png"}


def test_compare_logs_each_run_under_one_experiment(tmp_path: Path, mlflow_store: Any) -> None:
    from clusterfed.experiments.compare import compare

    compare(config(["mlflow"]), tmp_path / "cmp", ["fedavg", "ifca"])
    runs = mlflow_store.search_runs([mlflow_store.get_experiment_by_name("cmp").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["fedavg", "ifca"]
    for r in runs:
        assert_equal(mlflow_logged(mlflow_store, r.info.run_id), tmp_path / "cmp" / r.info.run_name)


def test_export_logs_a_finished_run_and_a_committed_record(tmp_path: Path,
                                                           mlflow_store: Any) -> None:
    folder = tmp_path / "plain"
    run_config(config([]), folder)
    result = CliRunner().invoke(main, ["export", str(folder), "--to", "mlflow"])
    assert result.exit_code == 0, result.output
    [run] = mlflow_store.search_runs([mlflow_store.get_experiment_by_name("plain").experiment_id])
    assert_equal(mlflow_logged(mlflow_store, run.info.run_id), folder)
    if not (RECORD / "metrics.jsonl").exists():
        pytest.skip(f"the committed reproduction record {RECORD} is absent")
    result = CliRunner().invoke(main, ["export", str(RECORD), "--to", "mlflow",
                                       "--experiment", "record"])
    assert result.exit_code == 0, result.output
    [run] = mlflow_store.search_runs([mlflow_store.get_experiment_by_name("record").experiment_id])
    assert_equal(mlflow_logged(mlflow_store, run.info.run_id), RECORD, sizes=False)


def test_export_to_tensorboard_writes_under_logdir(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed: "
                        "pip install 'clusterfed[tensorboard]'")
    folder = tmp_path / "plain"
    run_config(config([]), folder)
    result = CliRunner().invoke(main, ["export", str(folder), "--to", "tensorboard",
                                       "--logdir", str(tmp_path / "tb")])
    assert result.exit_code == 0, result.output
    assert not (folder / "tensorboard").exists()
    assert_equal(by_step(tensorboard_scalars(tmp_path / "tb" / "plain")), folder)


# Weights & Biases (offline) -------------------------------------------------------------------

def wandb_records(path: Path) -> Iterator[Any]:
    """The records of an offline run's .wandb file: W&B's protobuf Record messages in
    LevelDB's log framing (32 KiB blocks; a 7-byte header a fragment), which wandb 0.31 no
    longer reads from Python."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, position, pending = 32768, 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:   # the block's tail is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if length == 0 and kind == 0:
            break
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):   # FULL, LAST
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_logged(folder: Path) -> tuple[set[str], dict[int, dict[str, float]]]:
    """(run ids, step -> figures) of every offline run file under `folder`."""
    import json

    import wandb

    wandb.teardown()   # W&B's own process writes the run files: wait until it has finished

    ids, series = set(), {}
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "run":
                ids.add(record.run.run_id)
            if record.WhichOneof("record_type") != "history":
                continue
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                   for i in record.history.item}
            step = int(row.pop("_step"))
            for key, value in row.items():
                if isinstance(value, int | float) and not key.startswith("_"):
                    series.setdefault(key, []).append((step, value))
    return ids, by_step(series)


def test_wandb_offline_logs_equal_metrics_and_resume_the_same_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="the wandb extra is not installed: "
                        "pip install 'clusterfed[wandb]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    folder = tmp_path / "run"
    cut_off_after_round_3(config(["wandb"]), folder)
    resume_run(folder)
    ids, logged = wandb_logged(folder)
    assert len(ids) == 1 and len(list(folder.glob("wandb/offline-run-*"))) == 2
    assert_equal(logged, folder)


def test_benchmark_cells_log_as_runs_of_one_experiment(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed: "
                        "pip install 'clusterfed[tensorboard]'")
    from clusterfed.experiments import benchmark as bench

    scenario = list(bench.QUICK["scenarios"])[0]
    bench.run_benchmark(tmp_path / "bench", datasets=["digits"], scenarios=[scenario],
                        methods=["fedavg", "ifca"], seeds=[0],
                        overrides=["run.threads=1", "train.rounds=2", "run.progress=false",
                                   "run.loggers=[tensorboard]"])
    for method in ("fedavg", "ifca"):
        run = tmp_path / "bench" / "runs" / "digits" / scenario / "seed-0" / method
        assert cfg.load_source(str(run / "config.yaml"))[1]["run"]["experiment"] == "bench"
        assert_equal(by_step(tensorboard_scalars(run / "tensorboard")), run)


def test_the_flower_server_app_logs_as_the_simulator_does(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed: "
                        "pip install 'clusterfed[tensorboard]'")
    pytest.importorskip("flwr", reason="Flower is not installed: pip install "
                        "'clusterfed[flower]'")
    from flower_cases import CLIENTS, flower_config
    from flower_grid import LoopbackGrid

    from clusterfed.flower.launch import run_config_for
    from clusterfed.flower.server_app import run_experiment

    run_cfg = cfg.merge(flower_config({"name": "ifca"}, rounds=3, every=1),
                        {"run": {"loggers": ["tensorboard"]}})
    run_config(run_cfg, tmp_path / "sim")
    run_experiment(LoopbackGrid(range(CLIENTS)), run_config_for(run_cfg, tmp_path / "flower"),
                   report=False)
    logged = by_step(tensorboard_scalars(tmp_path / "flower" / "tensorboard"))
    assert_equal(logged, tmp_path / "flower")
    assert logged == by_step(tensorboard_scalars(tmp_path / "sim" / "tensorboard"))
