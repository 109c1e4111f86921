"""`clusterfed scenario describe`: its statistics by hand, the command on digits and MNIST."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import cli

from clusterfed.data.describe import (
    clients_per_cluster,
    compact_histogram,
    describe,
    format_description,
    label_histograms,
    size_summary,
)
from clusterfed.data.scenarios import ClientData, Federation
from clusterfed.report.scenario_plots import label_heatmap

pytestmark = pytest.mark.fast

PLOTS = ("clients_per_cluster.png", "samples_per_client.png", "label_histogram.png")


def client(train_y: list[int], test_y: list[int]) -> ClientData:
    def x(n: int) -> np.ndarray:
        return np.zeros((n, 1, 2, 2), dtype=np.float32)

    return ClientData(x(len(train_y)), np.array(train_y, dtype=np.int64), x(len(test_y)),
                      np.array(test_y, dtype=np.int64))


@pytest.fixture
def tiny() -> Federation:
    clients = [client([0, 0, 1], [0]), client([1, 1, 1, 1, 3], [1, 3]), client([2], [2, 2])]
    return Federation(clients, np.array([0, 0, 1]), 4, (1, 2, 2), {"pairs": [[0, 1]]})


def test_statistics_by_hand(tiny: Federation) -> None:
    assert clients_per_cluster(tiny.true_clusters) == {0: 2, 1: 1}
    assert size_summary([3, 5, 1]) == {"min": 1, "median": 3.0, "max": 5, "mean": 3.0,
                                       "total": 9}
    assert size_summary([]) == {"min": 0, "median": 0.0, "max": 0, "mean": 0.0, "total": 0}
    np.testing.assert_array_equal(label_histograms(tiny),
                                  [[2, 1, 0, 0], [0, 4, 0, 1], [0, 0, 1, 0]])
    np.testing.assert_array_equal(label_histograms(tiny, "test"),
                                  [[1, 0, 0, 0], [0, 1, 0, 1], [0, 0, 2, 0]])
    assert compact_histogram([2, 1, 0, 0]) == "0:2 1:1"
    assert compact_histogram([0, 0, 0]) == "-"
    assert compact_histogram([5, 1, 9, 3], limit=2) == "0:5 2:9 (+2 labels)"


def test_describe_and_format(tiny: Federation) -> None:
    d = describe(tiny)
    assert d["clients"] == 3 and d["n_classes"] == 4 and d["input_shape"] == [1, 2, 2]
    assert d["clients_per_cluster"] == {"0": 2, "1": 1}
    assert d["train_sizes"] == [3, 5, 1] and d["test_sizes"] == [1, 2, 2]
    assert d["train_samples"]["median"] == 3.0 and d["test_samples"]["total"] == 5
    assert d["labels_per_client"] == [2, 2, 1]
    assert d["info"] == {"pairs": [[0, 1]]}
    assert json.loads(json.dumps(d)) == d
    text = format_description(d, max_clients=2)
    lines = text.splitlines()
    assert lines[0] == "3 clients in 2 true clusters, 4 labels, input (1, 2, 2)"
    assert lines[1] == "clients per true cluster: 0: 2, 1: 1"
    assert lines[2] == "train samples per client: min 1, median 3, max 5 (total 9)"
    assert lines[5].split() == ["0", "0", "3", "1", "0:2", "1:1"]
    assert lines[6].split() == ["1", "0", "5", "2", "1:4", "3:1"]
    assert lines[7].startswith("... 1 more clients")


def test_a_mixture_lists_each_clients_source_shares(tiny: Federation) -> None:
    mixed = Federation(tiny.clients, tiny.true_clusters, 4, (1, 2, 2),
                       {"shares": [[0.25, 0.75], [0.5, 0.5], [0.9, 0.1]]})
    text = format_description(describe(mixed), max_clients=2)
    assert text.splitlines()[-1] == ("source shares per client (mixture; the true cluster is "
                                     "the largest): 0: 0.25/0.75; 1: 0.50/0.50")
    assert "source shares" not in format_description(describe(tiny))


def test_sequence_targets_count_every_token() -> None:
    c = ClientData(np.zeros((2, 3), np.int64), np.array([[1, 2, 2], [0, 2, 5]]),
                   np.zeros((0, 3), np.int64), np.zeros((0, 3), np.int64))
    fed = Federation([c], np.array([0]), 6, (3,))
    np.testing.assert_array_equal(label_histograms(fed), [[1, 1, 3, 0, 0, 1]])


def test_heatmap_of_a_large_vocabulary(tmp_path: Path) -> None:
    hist = np.random.default_rng(0).integers(0, 5, (4, 500))
    label_heatmap(hist, tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000




def test_cli_describe_digits(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    code, out, err = cli(capsys, "scenario", "describe", "quickstart", "scenario.clients=24",
                         "--out", str(tmp_path))
    assert code == 0, err
    assert "scenario label_swap on digits: 24 clients in 4 true clusters" in out
    assert "clients per true cluster: 0: 6, 1: 6, 2: 6, 3: 6" in out
    assert "... 4 more clients" in out
    for name in PLOTS:
        assert (tmp_path / name).stat().st_size > 1000, name
    saved = json.loads((tmp_path / "scenario.json").read_text())
    assert saved["clients"] == 24 and saved["scenario"]["kind"] == "label_swap"
    assert len(saved["info"]["pairs"]) == 4 and len(saved["train_label_histogram"]) == 24


def test_cli_describe_config_file_and_default_folder(capsys: pytest.CaptureFixture,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "skewed.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"dataset": "digits"},
        "scenario": {"kind": "dirichlet", "clients": 6, "alpha": 0.1,
                     "quantity_skew": {"sigma": 1.0}},
    }))
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "scenario", "describe", str(config), "scenario.min_size=5")
    assert code == 0, err
    assert "6 clients in 1 true clusters" in out
    folder = tmp_path / "runs" / "scenario-skewed"
    assert all((folder / name).exists() for name in PLOTS)
    info = json.loads((folder / "scenario.json").read_text())["info"]
    assert info["alpha"] == 0.1 and info["min_size"] == 5 and info["quantity_skew"]["sigma"] == 1


@pytest.mark.parametrize("override,message", [
    ("scenario.alpha=0", "error: the Dirichlet alpha must be a number > 0, got 0"),
    ("scenario.shards=2", "error: unknown config key scenario.shards"),
])
def test_cli_describe_bad_option_is_one_line(capsys: pytest.CaptureFixture, tmp_path: Path,
                                             override: str, message: str) -> None:
    code, out, err = cli(capsys, "scenario", "describe", "quickstart", "scenario.kind=dirichlet",
                         override, "--out", str(tmp_path))
    assert code == 2 and err.strip().startswith(message) and len(err.strip().splitlines()) == 1


# Every scenario that runs on MNIST (mix and writers need per-sample groups MNIST lacks).
MNIST = {
    "iid": ["scenario.samples_per_client=50"],
    "label_skew": ["scenario.labels_per_client=2", "scenario.samples_per_client=50",
                   "scenario.test=by_labels"],
    "label_groups": ["scenario.clusters=3", "scenario.samples_per_client=50"],
    "dirichlet": ["scenario.alpha=0.1", "scenario.samples_per_client=100"],
    "shards": ["scenario.samples_per_client=60"],
    "label_swap": ["scenario.clusters=2", "scenario.samples_per_client=50"],
    "label_permutation": ["scenario.clusters=2", "scenario.samples_per_client=50"],
    "rotation": ["scenario.clusters=4", "scenario.samples_per_client=50",
                 "scenario.labels={kind: dirichlet, alpha: 0.5}"],
    "invert": ["scenario.clusters=2", "scenario.samples_per_client=50"],
    "topics": ["scenario.clusters=4", "scenario.groups=[0, 1, 2, 3]",
               "scenario.samples_per_client=50"],
    "cyclic_classes": ["scenario.clusters=4", "scenario.samples_per_client=60",
                       "scenario.quantity_skew={sigma: 1.0, min_samples: 6}"],
}


@pytest.mark.shared_data
@pytest.mark.parametrize("kind", sorted(MNIST))
def test_cli_describe_on_mnist(kind: str, shared_data: Path, capsys: pytest.CaptureFixture,
                               tmp_path: Path) -> None:
    code, out, err = cli(capsys, "scenario", "describe", "mnist-iid", f"scenario.kind={kind}",
                         "scenario.clients=8", *MNIST[kind], "--data-dir", str(shared_data),
                         "--out", str(tmp_path))
    assert code == 0, err
    assert f"scenario {kind} on mnist: 8 clients" in out
    saved = json.loads((tmp_path / "scenario.json").read_text())
    assert saved["input_shape"] == [1, 28, 28] and len(saved["train_sizes"]) == 8
    assert all(size > 0 for size in saved["test_sizes"])
    for name in PLOTS:
        assert (tmp_path / name).stat().st_size > 1000, name


@pytest.mark.shared_data
def test_cli_describe_mix_of_real_mnist_and_fashion_mnist(shared_data: Path,
                                                         capsys: pytest.CaptureFixture,
                                                         tmp_path: Path) -> None:
    # `mix` needs per-sample sources: MNIST and Fashion-MNIST, one per true cluster.
    code, out, err = cli(capsys, "scenario", "describe", "mnist-iid", "data.dataset=mix",
                         "data.datasets=[mnist, fashion_mnist]", "data.shape=[1, 28, 28]",
                         "scenario.kind=mix", "scenario.clients=8", "scenario.clusters=2",
                         "scenario.samples_per_client=50", "--data-dir", str(shared_data),
                         "--out", str(tmp_path))
    assert code == 0, err
    saved = json.loads((tmp_path / "scenario.json").read_text())
    assert saved["input_shape"] == [1, 28, 28] and len(saved["train_sizes"]) == 8
    # MNIST's labels are 0-9, Fashion-MNIST's are offset to 10-19.
    assert saved["n_classes"] == 20


@pytest.mark.shared_data
def test_cli_describe_writers(shared_data: Path, capsys: pytest.CaptureFixture,
                              tmp_path: Path) -> None:
    # MNIST has no writers: one clear line. Shakespeare's roles are natural clients.
    code, _, err = cli(capsys, "scenario", "describe", "mnist-iid", "scenario.kind=writers",
                       "scenario.clients=8", "--data-dir", str(shared_data),
                       "--out", str(tmp_path / "mnist"))
    assert code == 2 and "group" in err and len(err.strip().splitlines()) == 1
    code, out, err = cli(capsys, "scenario", "describe", "mnist-iid",
                         "data.dataset=shakespeare", "data.source=leaf_raw", "data.stride=40",
                         "data.raw_dir=leaf_partial",
                         "model.name=char_lstm", "scenario.kind=writers", "scenario.clients=8",
                         "--data-dir", str(shared_data), "--out", str(tmp_path / "roles"))
    assert code == 0, err
    saved = json.loads((tmp_path / "roles" / "scenario.json").read_text())
    assert len(saved["train_sizes"]) == 8 and min(saved["train_sizes"]) > 0
