"""Runs on a federation whose true clusters are unknown (own data): no made-up ARI anywhere.

The federation: six client folders of sklearn's digits, the odd clients with every label
shifted by 5 (a concept shift), so a clustered method finds the two groups {0, 2, 4} and
{1, 3, 5} while the runtime knows nothing of them. `report --truth` scores them afterwards.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import cli
from sklearn.datasets import load_digits

from clusterfed import config as cfg
from clusterfed.algorithms.cfl import report as cfl_plots
from clusterfed.errors import ConfigError
from clusterfed.experiments.benchmark import run_benchmark
from clusterfed.report.pages import write_report
from clusterfed.run_folder import read_jsonl
from clusterfed.sim.simulation import run_config

CLIENTS = 6
TRUTH = [k % 2 for k in range(CLIENTS)]
# CFL made to split at the first chance, and only once (a 3-client cluster never splits).
CFL = {"name": "cfl", "rho": 1.0, "stagnation_window": 1, "acceptance": "fixed",
       "gamma_max": 0.0, "min_split_size": 4}
# Each other clustered method with options that make it cluster within three rounds.
OTHERS = {"flhc": {"name": "flhc", "rounds_before_clustering": 1, "threshold_mode": "clusters",
                   "threshold": 2},
          "ifca": {"name": "ifca", "k": 2},
          "lcfl": {"name": "lcfl", "warmup_rounds": 1, "k": 2},
          "pacfl": {"name": "pacfl", "n_clusters": 2}}


def write_folders(root: Path, per_client: int = 120) -> Path:
    """DIR/client-K/data.npz of digits (uint8, 1x8x8); odd clients' labels shifted by 5."""
    digits = load_digits()
    x = (digits.images * 15).astype(np.uint8)[:, None]
    order = np.random.default_rng(0).permutation(len(digits.target))
    for k in range(CLIENTS):
        idx = order[k * per_client:(k + 1) * per_client]
        y = (digits.target[idx] + 5 * (k % 2)) % 10
        (root / f"client-{k}").mkdir(parents=True)
        np.savez(root / f"client-{k}" / "data.npz", x=x[idx], y=y)
    return root


def overrides(root: Path, rounds: int = 4) -> list[str]:
    return ["data.dataset=folders", f"data.root={root}", "data.test_fraction=0.25",
            "model.name=mlp", f"train.rounds={rounds}", "train.local_epochs=2", "eval.every=1",
            "run.progress=false", "run.checkpoint_every=0", "run.threads=1"]


def config(root: Path, algorithm: dict[str, Any], rounds: int = 4) -> dict[str, Any]:
    return cfg.merge(cfg.resolve("quickstart", overrides(root, rounds)),
                     {"algorithm": algorithm})


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_folders(tmp_path_factory.mktemp("own") / "federation")


@pytest.fixture(scope="module")
def cfl_run(folders: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cfl-no-truth")
    run_config(config(folders, CFL), out)
    return out


def copy_of(run: Path, tmp_path: Path) -> Path:
    """A copy of the module's run folder, so a test's report does not meet another's."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def groups(assignment: list[int]) -> set[frozenset[int]]:
    return {frozenset(np.flatnonzero(np.asarray(assignment) == k).tolist())
            for k in set(assignment)}


def test_a_no_truth_run_records_no_scores(cfl_run: Path) -> None:
    summary = json.loads((cfl_run / "summary.json").read_text())
    c = summary["clustering"]
    assert c["ari"] is None and c["nmi"] is None and c["true_assignment"] is None
    assert summary["final"]["per_true_cluster_accuracy"] is None
    assert c["n_clusters"] == 2
    assert groups(c["assignment"]) == {frozenset({0, 2, 4}), frozenset({1, 3, 5})}
    assert len(summary["final"]["per_client_accuracy"]) == CLIENTS
    evaluated = [m for m in read_jsonl(cfl_run / "metrics.jsonl") if "mean_accuracy" in m]
    assert evaluated
    for m in evaluated:
        assert m["ari"] is None and m["nmi"] is None and m["per_true_cluster_accuracy"] is None
        assert len(m["per_client_accuracy"]) == CLIENTS and m["per_cluster_accuracy"]
        assert "separation_gap" not in m   # g(alpha) needs the true clusters


def test_a_no_truth_report_shows_found_clusters_and_no_score(cfl_run: Path,
                                                             tmp_path: Path) -> None:
    run = copy_of(cfl_run, tmp_path)
    text = write_report(run).read_text()
    assert "ARI" not in text and "NMI" not in text and "against true clusters" not in text
    assert "true clusters are unknown" in text
    members = sorted(re.findall(r"^\| \d+ \| 3 \| [\d.]+ \| ([\d, ]+) \|$", text, re.M))
    assert members == ["0, 2, 4", "1, 3, 5"]   # the clusters found, sizes and members
    assert "grouped by found cluster" in text
    for image in ("accuracy.png", "per_client.png", cfl_plots.IMAGES["similarity"],
                  cfl_plots.IMAGES["tree"]):
        assert (run / image).stat().st_size > 1000, image
        assert f"]({image})" in text
    assert not (run / "clusters.png").exists()     # found against true: nothing to show
    assert not (run / cfl_plots.IMAGES["gap"]).exists()


def test_similarity_panels_group_by_found_cluster_without_truth(
        cfl_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real, seen = cfl_plots._similarity_panel, []

    def spy(ax: Any, event: Any, labels: np.ndarray, what: str) -> Any:
        seen.append((np.asarray(labels).tolist(), what))
        return real(ax, event, labels, what)

    monkeypatch.setattr(cfl_plots, "_similarity_panel", spy)
    write_report(copy_of(cfl_run, tmp_path))
    found = json.loads((cfl_run / "summary.json").read_text())["clustering"]["assignment"]
    assert seen == [(found, "found")]   # one split, its members grouped by the clusters found


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_every_method_report_copes_without_truth(name: str, folders: Path,
                                                 tmp_path: Path) -> None:
    run_config(config(folders, OTHERS[name], rounds=3), tmp_path)
    text = write_report(tmp_path).read_text()
    assert "ARI" not in text and "NMI" not in text
    assert f"## {'FL+HC' if name == 'flhc' else name.upper()}" in text


def test_cli_run_says_ari_is_not_available(folders: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    code, out, err = cli(capsys, "run", "quickstart", *overrides(folders, rounds=2),
                         "algorithm.name=fedavg", "--out", str(tmp_path))
    assert code == 0, err
    assert "ARI n/a (no truth)" in out


def test_report_truth_scores_the_run_afterwards(cfl_run: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    run = copy_of(cfl_run, tmp_path)
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"true_clusters": TRUTH}))
    code, out, err = cli(capsys, "report", str(run), "--truth", str(truth))
    assert code == 0, err
    text = (run / "report.md").read_text()
    assert "ARI 1.000, NMI 1.000" in text and str(truth) in text
    # Per evaluated round, from the assignments events.jsonl holds: 1 cluster, then 2.
    section = text.split("## Scores per round", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split("|")[3].strip() for r in rows] == ["0.000", "1.000", "1.000", "1.000"]
    assert (run / "clusters.png").exists()
    # The run's own records stay as the runtime wrote them.
    assert json.loads((run / "summary.json").read_text())["clustering"]["ari"] is None


def test_report_refuses_a_truth_of_another_length(cfl_run: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps({"true_clusters": TRUTH + [0]}))
    code, _, err = cli(capsys, "report", str(cfl_run), "--truth", str(truth))
    assert code == 2
    assert "7 clients" in err and "6" in err


def test_compare_shows_no_ari(folders: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture) -> None:
    code, out, err = cli(capsys, "compare", "quickstart", *overrides(folders, rounds=2),
                         "--algorithms", "fedavg,local", "--out", str(tmp_path))
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith(("fedavg", "local"))]
    assert [r[2] for r in rows] == ["n/a", "n/a"]
    assert "n/a" in (tmp_path / "report.md").read_text()


def test_benchmark_refuses_a_federation_without_truth(folders: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="true clusters are unknown"):
        run_benchmark(tmp_path, datasets=["digits"], scenarios=["label_swap"],
                      methods=["fedavg"], seeds=[0],
                      overrides=["data.dataset=folders", f"data.root={folders}",
                                 "data.test_fraction=0.25"])
    assert not (tmp_path / "results.jsonl").exists() or not (
        tmp_path / "results.jsonl").read_text()


def test_scenario_describe_copes(folders: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture) -> None:
    code, out, err = cli(capsys, "scenario", "describe", "quickstart", "data.dataset=folders",
                         f"data.root={folders}", "data.test_fraction=0.25", "--out",
                         str(tmp_path))
    assert code == 0, err
    assert "6 clients, true clusters unknown" in out
    saved = json.loads((tmp_path / "scenario.json").read_text())
    assert saved["true_clusters"] is None and saved["clients_per_cluster"] is None
    assert (tmp_path / "samples_per_client.png").exists()
