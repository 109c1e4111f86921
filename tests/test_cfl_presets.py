"""The CFL paper presets (Sattler et al., 2020): they resolve, say what they reproduce, and the
small ones whose data are in ../shared/data build their federation and run 2 rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clusterfed import config as cfg
from clusterfed.algorithms import build_algorithm
from clusterfed.experiments.compare import algorithm_sections
from clusterfed.sim.simulation import build_federation_for, run_config

# name -> (clients, true clusters): every paper preset has a full and a -small variant.
PAPER_PRESETS = {
    "cfl-gap-datasize": (20, 4),
    "cfl-gap-rounds": (20, 4),
    "cfl-congruence": (2, 2),
    "cfl-incongruence": (2, 2),
    "cfl-cifar10-permutation": (20, 4),
    "cfl-fmnist-permutation": (20, 4),
    "cfl-agnews": (20, 4),
    "cfl-emnist-rotation": (10, 2),
}
ALL_CFL = [name for name in cfg.preset_names() if name.startswith("cfl-")]
# The files each small preset reads under the data root, and extra overrides that keep its
# 2-round run short at one thread.
SMALL_DATA = {
    "cfl-gap-datasize-small": ("mnist/raw/train-images-idx3-ubyte.gz", []),
    "cfl-gap-rounds-small": ("mnist/raw/train-images-idx3-ubyte.gz", []),
    "cfl-congruence-small": ("mnist/raw/train-images-idx3-ubyte.gz", []),
    "cfl-incongruence-small": ("mnist/raw/train-images-idx3-ubyte.gz", []),
    "cfl-cifar10-permutation-small": ("cifar10", ["scenario.samples_per_client=50"]),
    "cfl-fmnist-permutation-small": ("fashion_mnist/raw/train-images-idx3-ubyte.gz",
                                     ["scenario.samples_per_client=100"]),
    "cfl-agnews-small": ("ag_news/test.csv", ["scenario.samples_per_client=20"]),
    "cfl-emnist-rotation-small": ("mnist/raw/train-images-idx3-ubyte.gz", []),
}
# Presets whose CFL never tests a split: plain FL measured by CFL's per-round diagnostics.
MEASURING = ["cfl-gap-datasize", "cfl-gap-rounds", "cfl-congruence", "cfl-incongruence"]


def raw_text(name: str) -> str:
    return cfg.preset_paths()[name].read_text()


def needs(shared_data: Path, name: str) -> Path:
    """The data root for a small preset, or a skip naming the missing data."""
    path = shared_data / SMALL_DATA[name][0]
    if not path.exists():
        pytest.skip(f"{name} needs {SMALL_DATA[name][0]} under the data root {shared_data}; "
                    f"it is absent")
    return shared_data


@pytest.mark.parametrize("name", ALL_CFL)
def test_every_cfl_preset_resolves(name: str) -> None:
    config = cfg.resolve(name)
    assert config["algorithm"]["name"] in ("cfl", "fedavg")
    assert raw_text(name).startswith("#"), "a preset says what it reproduces in a comment"
    if config["algorithm"]["name"] == "cfl":   # the paper's rule, whatever the default
        assert config["algorithm"]["split_into"] == "two"


def test_every_paper_preset_has_a_small_variant_with_the_same_structure() -> None:
    for name, (clients, clusters) in PAPER_PRESETS.items():
        assert name in ALL_CFL and f"{name}-small" in ALL_CFL
        full, small = cfg.resolve(name), cfg.resolve(f"{name}-small")
        for config in (full, small):
            assert config["scenario"]["clients"] == clients
            assert config["scenario"]["clusters"] == clusters
        assert full["scenario"]["kind"] == small["scenario"]["kind"]
        assert small["train"]["rounds"] <= full["train"]["rounds"]


@pytest.mark.parametrize("name", [n for p in PAPER_PRESETS for n in (p, f"{p}-small")])
def test_compare_lists_the_fl_baseline_beside_a_cfl_that_can_split(name: str) -> None:
    config = cfg.resolve(name)
    sections = algorithm_sections(config, None)
    assert [s["name"] for s in sections][:2] == ["fedavg", "cfl"]
    for section in sections:   # every listed option is one its algorithm takes
        build_algorithm(cfg.merge(config, {"algorithm": section})["algorithm"])
    cfl = cfg.merge(config, {"algorithm": sections[1]})["algorithm"]
    assert cfl.get("warmup_rounds", 0) < config["train"]["rounds"]


@pytest.mark.parametrize("name", [n for p in MEASURING for n in (p, f"{p}-small")])
def test_measuring_presets_run_plain_fl(name: str) -> None:
    config = cfg.resolve(name)
    assert config["algorithm"]["name"] == "cfl"
    assert config["algorithm"]["warmup_rounds"] > config["train"]["rounds"]


def test_paper_settings_of_the_full_presets() -> None:
    gap = cfg.resolve("cfl-gap-datasize")
    assert gap["train"]["rounds"] == 50 and gap["train"]["local_epochs"] == 3
    assert gap["scenario"]["kind"] == "label_swap"
    assert cfg.resolve("cfl-gap-rounds")["scenario"]["samples_per_client"] == 100
    congruent = cfg.resolve("cfl-congruence")["scenario"]
    assert congruent["kind"] == "label_groups"
    assert congruent["group_labels"] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert cfg.resolve("cfl-incongruence")["scenario"]["kind"] == "label_swap"
    for name in ("cfl-congruence", "cfl-incongruence"):
        assert cfg.resolve(name)["train"]["rounds"] == 1000
    for name in ("cfl-cifar10-permutation", "cfl-fmnist-permutation"):
        config = cfg.resolve(name)
        assert config["scenario"]["kind"] == "label_permutation"
        assert config["train"]["rounds"] == 200
        assert config["train"]["batch_size"] == 100
    cifar = cfg.resolve("cfl-cifar10-permutation")
    assert cifar["model"]["name"] == "cnn5_cifar" and cifar["train"]["lr"] == 0.05
    ag = cfg.resolve("cfl-agnews")
    assert ag["model"]["name"] == "lstm_lm" and ag["train"]["rounds"] == 100
    assert ag["train"]["lr"] == 1.0 and ag["train"]["clip_grad_norm"] == 0.25


@pytest.mark.parametrize("name", ["cfl-cifar10-permutation", "cfl-cifar10-permutation-small",
                                  "cfl-fmnist-permutation", "cfl-fmnist-permutation-small"])
def test_permutation_clients_are_tested_on_the_whole_test_set(name: str) -> None:
    """Eqs. 52/53: each client's test set is the whole test set with its permutation."""
    assert cfg.resolve(name)["scenario"]["test"] == "all"


def test_agnews_full_needs_the_training_split_and_small_runs_on_the_test_split() -> None:
    assert "train_from_test" not in cfg.resolve("cfl-agnews")["data"]
    assert cfg.resolve("cfl-agnews-small")["data"]["train_from_test"] == 0.8


def test_emnist_rotation_has_the_reference_code_settings() -> None:
    for name in ("cfl-emnist-rotation", "cfl-emnist-rotation-small"):
        config = cfg.resolve(name)
        scenario, train, algo = config["scenario"], config["train"], config["algorithm"]
        assert scenario["kind"] == "rotation" and scenario["angles"] == [180, 0]
        assert scenario["labels"] == {"kind": "dirichlet", "alpha": 1.0}
        assert scenario["samples_per_client"] == 1000
        assert config["model"]["name"] == "cfl_convnet"
        assert (train["lr"], train["momentum"], train["lr_decay"]) == (0.1, 0.9, 0.99)
        assert (train["batch_size"], train["local_epochs"]) == (128, 1)
        assert (algo["eps1"], algo["eps2"], algo["gamma_max"]) == (0.4, 1.6, 0.0)
        assert algo["bipartition"] == "complete"
        assert (algo["warmup_rounds"], algo["min_split_size"]) == (20, 3)
    full = cfg.resolve("cfl-emnist-rotation")
    assert full["data"] == {"dataset": "emnist", "root": None, "split": "byclass"}
    assert full["train"]["rounds"] == 80
    assert full["scenario"]["test_samples_per_client"] == 1000


def contiguous(clients: int, clusters: int) -> list[int]:
    return [i * clusters // clients for i in range(clients)]


@pytest.mark.shared_data
@pytest.mark.parametrize("name", sorted(SMALL_DATA))
def test_small_preset_runs_two_rounds(name: str, shared_data: Path) -> None:
    root = needs(shared_data, name)
    config = cfg.resolve(name, ["train.rounds=2", "run.progress=false", "run.threads=1",
                                "eval.every=2", *SMALL_DATA[name][1]])
    federation = build_federation_for(config, str(root))
    clients, clusters = PAPER_PRESETS[name.removesuffix("-small")]
    assert federation.num_clients == clients
    assert federation.true_clusters.tolist() == contiguous(clients, clusters)
    records: list[dict[str, Any]] = []
    summary = run_config(config, federation=federation,
                         callbacks=[lambda _, record: records.append(dict(record))])
    assert summary["rounds"] == 2 and len(records) == 2
    assert summary["clustering"]["true_assignment"] == contiguous(clients, clusters)
    assert np.isfinite(summary["final"]["mean_loss"])
    if name.removesuffix("-small") in MEASURING:
        # Plain FL with CFL's diagnostics: one cluster, the gap and both norms every round.
        assert summary["clustering"]["n_clusters"] == 1
        for record in records:
            assert set(record["cfl"]["0"]) >= {"mean_norm", "max_norm", "alpha_cross_max"}
            assert np.isfinite(record["separation_gap"]["0"])


@pytest.mark.shared_data
def test_emnist_rotation_small_rotates_clients_0_to_4(shared_data: Path) -> None:
    root = needs(shared_data, "cfl-emnist-rotation-small")
    config = cfg.resolve("cfl-emnist-rotation-small")
    rotated = build_federation_for(config, str(root))
    assert rotated.info["angles"] == [180.0, 0.0]
    assert rotated.true_clusters.tolist() == [0] * 5 + [1] * 5
    # The same partition (same seed) without rotation: clients 0-4 hold its images turned by
    # 180 degrees, clients 5-9 the same images.
    upright = build_federation_for(cfg.resolve(config, ["scenario.angles=[0, 0]"]), str(root))
    for i, (a, b) in enumerate(zip(rotated.clients, upright.clients, strict=True)):
        assert np.array_equal(a.train_y, b.train_y)
        expected = np.rot90(b.train_x, 2, axes=(-2, -1)) if i < 5 else b.train_x
        assert np.array_equal(a.train_x, expected), i
        expected = np.rot90(b.test_x, 2, axes=(-2, -1)) if i < 5 else b.test_x
        assert np.array_equal(a.test_x, expected), i
