"""The recorded small-scale claims of docs/reproductions/fedem.md and fedrc.md; long, so marked.

Each reruns the -small preset's seed 0 for the algorithms the claim is about and checks the
recorded figures (within a point or two: the runs are deterministic up to thread scheduling).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterfed import config as cfg
from clusterfed.experiments.compare import compare

pytestmark = pytest.mark.reproduction

QUIET = ["run.progress=false", "run.threads=1", "seed=0"]


def accuracy(summary: dict) -> float:
    return 100 * summary["final"]["mean_accuracy"]


def served_accuracy(folder: Path) -> float:
    """The last evaluation's served-model figure of a run under eval.protocol=mixture (the
    argmax component's: what the protocol 'cluster' scores)."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return 100 * [r for r in records if "served_mean_accuracy" in r][-1]["served_mean_accuracy"]


def test_fedem_synthetic_small_as_recorded(tmp_path):
    """fedem-synthetic-small, seed 0, 50 rounds: FedAvg 68.2 %, Local 61.6 %, FedEM (M = 3)
    63.8 % predicting with its mixture (the preset's protocol) and 60.1 % served as its most
    probable component: below FedAvg either way, its components not separated (ARI 0.04
    against each client's dominant component)."""
    config = cfg.resolve("fedem-synthetic-small", QUIET)
    summaries = compare(config, tmp_path, ["fedavg", "local", "fedem"])["summaries"]
    assert accuracy(summaries["fedavg"]) == pytest.approx(68.2, abs=1.5)
    assert accuracy(summaries["local"]) == pytest.approx(61.6, abs=1.5)
    assert accuracy(summaries["fedem"]) == pytest.approx(63.8, abs=2.0)
    assert served_accuracy(tmp_path / "fedem") == pytest.approx(60.1, abs=2.0)
    assert served_accuracy(tmp_path / "fedem") < accuracy(summaries["fedem"]) \
        < accuracy(summaries["fedavg"])
    assert summaries["fedem"]["clustering"]["ari"] < 0.2


@pytest.mark.shared_data
def test_fedrc_fmnist_c_small_as_recorded(shared_data, tmp_path):
    """fedrc-fmnist-c-small, seed 0, 80 rounds: FedAvg 23.3 %, FedRC (K = 3, served as its
    most probable component) 21.4 %: at this scale neither learns the three concepts, and
    FedRC's components do not follow them (ARI -0.02 against the concepts, -0.03 against the
    corruptions); predicting with its mixture (the preset's protocol) 24.9 %."""
    config = cfg.resolve("fedrc-fmnist-c-small", [f"data.root={shared_data}", *QUIET])
    summaries = compare(config, tmp_path, ["fedavg", "fedrc"])["summaries"]
    assert accuracy(summaries["fedavg"]) == pytest.approx(23.3, abs=2.0)
    assert accuracy(summaries["fedrc"]) == pytest.approx(24.9, abs=2.5)
    assert served_accuracy(tmp_path / "fedrc") == pytest.approx(21.4, abs=2.5)
    assert summaries["fedrc"]["clustering"]["ari"] < 0.2
