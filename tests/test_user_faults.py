"""What a new user tripped on (issue 60): damaged checkpoints, a client never evaluated, NaN in
JSON, a missing secret file under Flower. Each answer is one line, and nothing is lost."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from helpers import cli, comparable, tiny_config

from clusterfed import strict_json
from clusterfed.run_folder import CHECKPOINT, PREVIOUS, RunFolder
from clusterfed.sim.simulation import resume_run, run_config


def cut(path, keep=600):
    """A file cut short, as a full disk or a half copy leaves it."""
    path.write_bytes(path.read_bytes()[:keep])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-round run, checkpointed every round, and its summary."""
    folder = tmp_path_factory.mktemp("finished")
    config = tiny_config("fedavg", run={"threads": 1, "executor": "sequential"})
    return folder, run_config(config, folder)


def cut_off_copy(finished, tmp_path):
    """The finished run as if cut off after its last checkpoint: no summary."""
    folder, _ = finished
    copy = tmp_path / "run"
    copy.mkdir()
    for p in folder.iterdir():
        if p.is_file() and p.name != "summary.json":
            (copy / p.name).write_bytes(p.read_bytes())
    return copy


def test_a_damaged_checkpoint_resumes_from_the_one_before(finished, tmp_path, caplog):
    folder = cut_off_copy(finished, tmp_path)
    assert (folder / PREVIOUS).exists()   # every save keeps the one before
    cut(folder / CHECKPOINT)
    with caplog.at_level(logging.WARNING, logger="clusterfed"):
        summary = resume_run(folder)
    assert "resuming from the checkpoint before it" in caplog.text
    # The previous checkpoint is round 3 of 4: round 4 runs again, to the same numbers.
    assert comparable(summary) == comparable(finished[1])
    assert len(RunFolder(folder).load_checkpoint()["state"].__dict__) > 0


def test_a_crash_between_the_two_renames_still_resumes(finished, tmp_path):
    folder = cut_off_copy(finished, tmp_path)
    (folder / CHECKPOINT).unlink()   # moved to PREVIOUS, the new one not yet in place
    rounds: list[int] = []
    summary = resume_run(folder, callbacks=[lambda r, record: rounds.append(r)])
    assert rounds == [4]   # from round 3's checkpoint, not from the start
    assert comparable(summary) == comparable(finished[1])


def test_every_checkpoint_damaged_is_one_line_and_touches_nothing(capsys, finished, tmp_path):
    folder = cut_off_copy(finished, tmp_path)
    for name in (CHECKPOINT, PREVIOUS):
        cut(folder / name)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    code, _, err = cli(capsys, "run", "--resume", str(folder))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "damaged" in err and f"--out {folder} --overwrite" in err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_saving_keeps_the_last_checkpoint_until_the_new_one_is_whole(tmp_path, monkeypatch):
    run = RunFolder(tmp_path)
    run.save_checkpoint({"round": 1})

    def crash(path, data):
        path.write_bytes(data[:10])
        raise OSError("disk full")

    monkeypatch.setattr("clusterfed.run_folder.save_atomic", crash)
    with pytest.raises(OSError):
        run.save_checkpoint({"round": 2})
    assert run.load_checkpoint() == {"round": 1}


@pytest.fixture
def own_data_one_client_without_test(tmp_path):
    """Two npz clients; client 1 holds no test data, so it cannot be evaluated."""
    rng = np.random.default_rng(0)
    for k in range(2):
        (tmp_path / "data" / f"client-{k}").mkdir(parents=True)
        x, y = rng.random((20, 1, 8, 8), dtype=np.float32), np.arange(20) % 10
        arrays = {"x_train": x, "y_train": y}
        if k == 0:
            arrays |= {"x_test": x[:5], "y_test": y[:5]}
        np.savez(tmp_path / "data" / f"client-{k}" / "d.npz", **arrays)
    return tmp_path / "data"


def test_a_client_not_evaluated_is_named_and_its_figures_are_null(capsys, tmp_path,
                                                                  own_data_one_client_without_test):
    out = tmp_path / "run"
    code, stdout, err = cli(capsys, "run", "quickstart", "data.dataset=folders",
                            f"data.root={own_data_one_client_without_test}",
                            "data.n_classes=10", "train.rounds=1", "run.progress=false",
                            "run.threads=1", "--out", str(out))
    assert code == 0, err
    assert "clients not evaluated: 1" in stdout
    summary = strict_json.loads((out / "summary.json").read_text())
    assert summary["final"]["per_client_accuracy"][1] is None
    assert summary["final"]["unevaluated_clients"] == [1]
    for line in (out / "metrics.jsonl").read_text().splitlines():
        strict_json.loads(line)
    report = (out / "report.md").read_text()
    assert "over 1 of 2 clients; not evaluated (no reply, or no test data): client 1" in report
    assert "(1 of 2 evaluated)" in report


def test_strict_json_refuses_nan_and_writes_null():
    assert strict_json.dumps({"a": [1.0, float("nan")], "b": float("inf")}) == \
        '{"a": [1.0, null], "b": null}'
    with pytest.raises(ValueError, match="NaN is not JSON"):
        strict_json.loads('{"a": NaN}')
    assert json.loads(strict_json.dumps({"x": (0.5, float("-inf"))})) == {"x": [0.5, None]}


def test_flower_checks_the_secret_file_before_starting_anything(capsys, tmp_path, monkeypatch,
                                                                own_data_one_client_without_test):
    pytest.importorskip("flwr")

    def started(*args, **kwargs):
        raise AssertionError("a Flower process was started")

    monkeypatch.setattr("clusterfed.flower.launch.LocalFederation", started)
    code, _, err = cli(capsys, "flower", "local", "--own-data",
                       str(own_data_one_client_without_test), "--secret-file",
                       str(tmp_path / "nonexistent.secret"), "quickstart",
                       "run.privacy=permutation", "--out", str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{tmp_path / 'nonexistent.secret'} does not exist" in err
    assert not (tmp_path / "out").exists()


def test_per_client_bars_mark_a_client_not_evaluated(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from clusterfed.report import plots

    marked: list[tuple[float, str]] = []
    real = Axes.text

    def spy(self, x, y, s, *args, **kwargs):
        marked.append((x, s))
        return real(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(Axes, "text", spy)
    plots.per_client_bars([0.5, None, 0.75], [0, 0, 1], tmp_path / "per_client.png")
    assert marked == [(1, "not evaluated")]
    assert (tmp_path / "per_client.png").stat().st_size > 0


def test_the_comparison_table_names_the_clients_not_evaluated():
    from clusterfed.report.tables import table_rows

    def summary(missing):
        final = {"mean_accuracy": 0.5, **({"unevaluated_clients": missing} if missing else {})}
        return {"final": final, "clustering": {"ari": None, "n_clusters": 1},
                "wall_seconds": 1.0}

    rows = table_rows({"algorithms": ["fedavg", "local"],
                       "summaries": {"fedavg": summary([2, 5]), "local": summary(None)}})
    assert rows[0][-1] == "not evaluated"
    assert [r[-1] for r in rows[1:]] == ["2,5", "-"]
    assert table_rows({"algorithms": ["local"], "summaries": {"local": summary(None)}})[0][-1] \
        == "seconds"
