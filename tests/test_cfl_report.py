"""CFL's report section: the split table, the five figures, and the functions behind them."""

from __future__ import annotations

import json
import shutil

import matplotlib.image as mpimg
import numpy as np
import pytest
from helpers import tiny_config

from clusterfed.algorithms.cfl import maths as cfl_math
from clusterfed.algorithms.cfl import report as cfl_plots
from clusterfed.config import merge
from clusterfed.report.pages import write_report
from clusterfed.run_folder import read_jsonl
from clusterfed.sim.simulation import run_config


def tiny_cfl() -> dict:
    """Digits, 4 disjoint label swaps over 8 clients: splits within 30 rounds."""
    base = tiny_config("cfl", scenario={"kind": "label_swap", "clients": 8, "clusters": 4},
                       train={"rounds": 30, "participation": 1.0, "local_epochs": 3,
                              "batch_size": 10, "lr": 0.05, "momentum": 0.5},
                       eval={"every": 5}, run={"checkpoint_every": 0})
    return merge(base, {"algorithm": {"name": "cfl", "min_child_size": 2}})


@pytest.fixture(scope="module")
def cfl_run(tmp_path_factory):
    """One CFL run and its report for the whole module (the run is the slow part)."""
    out = tmp_path_factory.mktemp("cfl-report")
    run_config(tiny_cfl(), out, data_dir=str(tmp_path_factory.mktemp("data-root")))
    write_report(out)
    summary = json.loads((out / "summary.json").read_text())
    return out, read_jsonl(out / "events.jsonl"), summary["clustering"]["true_assignment"]


def table_rows(report: str) -> list[list[str]]:
    """The cells of the CFL split table's body rows."""
    section = report.split("## CFL", 1)[1].split("###", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


def test_report_lists_every_split_in_its_table(cfl_run):
    out, events, true = cfl_run
    report = (out / "report.md").read_text()
    assert report.count("## CFL") == 1
    found = cfl_plots.splits(events)
    assert found, "the tiny run should split at least once"
    rows = table_rows(report)
    assert len(rows) == len(found)
    for row, e in zip(rows, found, strict=True):
        assert row[:4] == [str(e["round"]), str(e["node"]),
                           ", ".join(map(str, e["children"])),
                           " + ".join(str(len(p)) for p in e["parts"])]
        assert float(row[4]) == pytest.approx(e["alpha_cross_max"], abs=1e-4)
        assert float(row[5]) == pytest.approx(e["gamma_bound"], abs=1e-4)
        assert float(row[6]) == pytest.approx(cfl_plots.event_gap(e, true), abs=1e-4)


def test_every_figure_exists_is_linked_and_is_not_blank(cfl_run):
    out, _, _ = cfl_run
    report = (out / "report.md").read_text()
    for name in cfl_plots.IMAGES.values():
        assert f"]({name})" in report
        assert (out / name).stat().st_size > 10_000
        pixels = mpimg.imread(out / name)
        assert min(pixels.shape[:2]) >= 300
        assert pixels[..., :3].std() > 0.05   # more than a background


def test_grouped_order_puts_each_true_cluster_together():
    labels = [2, 0, 1, 0, 2, 1]
    order = cfl_plots.grouped_order(labels)
    assert order.tolist() == [1, 3, 2, 5, 0, 4]
    # Inside a true cluster, the split's parts stay apart; ties keep member order.
    assert cfl_plots.grouped_order([0, 0, 0, 1, 0], [1, 0, 1, 0, 0]).tolist() == [1, 4, 0, 2, 3]


def test_similarity_panels_are_grouped_by_true_cluster(cfl_run):
    _, events, true = cfl_run
    for e in cfl_plots.splits(events):
        labels = np.asarray(true)[e["members"]]
        grouped = labels[cfl_plots.grouped_order(labels, cfl_plots.part_index(e))]
        # Grouped: each true cluster is one run of adjacent positions.
        assert len(np.unique(grouped)) == 1 + np.count_nonzero(np.diff(grouped))
        assert sorted(grouped.tolist()) == grouped.tolist()


def test_part_index_follows_the_logged_parts():
    event = {"members": [3, 5, 8, 9], "parts": [[5, 9], [3, 8]]}
    assert cfl_plots.part_index(event).tolist() == [1, 0, 1, 0]


def test_gap_equals_separation_gap_on_the_logged_matrices(cfl_run):
    _, events, true = cfl_run
    tests = cfl_plots.split_tests(events)
    points = cfl_plots.gap_points(events, true)
    assert len(points) == len(tests) > 0
    for p, e in zip(points, tests, strict=True):
        labels = np.asarray(true)[e["members"]]
        assert p["gap"] == cfl_math.separation_gap(np.array(e["similarity"]), labels)
        assert (p["round"], p["node"], p["accepted"]) == (e["round"], e["node"],
                                                          e["type"] == "split")


def test_gap_of_a_hand_made_rejected_test():
    # Two true clusters {0, 1} and {2}: intra min 0.9, cross max of the best cut 0.2.
    event = {"type": "split_rejected", "round": 4, "node": 0, "members": [0, 1, 2],
             "similarity": [[1.0, 0.9, 0.2], [0.9, 1.0, 0.1], [0.2, 0.1, 1.0]]}
    [point] = cfl_plots.gap_points([event, {"type": "assignment"}], [0, 0, 1])
    assert point == {"round": 4, "node": 0, "accepted": False, "gap": pytest.approx(0.7)}


def test_tree_from_the_split_events(cfl_run):
    _, events, true = cfl_run
    tree = cfl_plots.tree_from_events(events, len(true))
    leaves = [v for v, node in tree.items() if not node["children"]]
    assert len(leaves) == len(cfl_plots.splits(events)) + 1
    members = sorted(c for v in leaves for c in tree[v]["members"])
    assert members == list(range(len(true)))
    place = cfl_plots.tree_layout(tree)
    for v, node in tree.items():
        for c in node["children"]:
            assert place[c][1] == place[v][1] + 1
        if node["children"]:
            assert place[v][0] == pytest.approx(np.mean([place[c][0] for c in node["children"]]))
    assert cfl_plots.tree_from_events([], 3) == {
        0: {"members": [0, 1, 2], "children": [], "round": None}}


def test_similarity_panels_are_capped(cfl_run, tmp_path):
    _, events, true = cfl_run
    first = cfl_plots.splits(events)[0]
    many = [{**first, "round": r} for r in range(8)]
    assert cfl_plots.similarity_panels(many, true, tmp_path / "s.png") == cfl_plots.MAX_PANELS
    assert (tmp_path / "s.png").exists()
    assert cfl_plots.similarity_panels([], true, tmp_path / "none.png") == 0
    assert not (tmp_path / "none.png").exists()


def test_a_run_without_split_tests_says_so(cfl_run, tmp_path):
    out, events, _ = cfl_run
    folder = tmp_path / "no-splits"
    shutil.copytree(out, folder)
    kept = [e for e in events if e["type"] not in cfl_plots.TESTS]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    # With the per-round gaps still logged, the gap figure draws them.
    assert "cfl_gap.png" in write_report(folder).read_text()
    metrics = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        m.pop("separation_gap", None)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    report = write_report(folder).read_text()
    assert "No split happened (0 split tests rejected)." in report
    assert "No split test was run" in report
    # Figures of nothing are neither drawn nor left over from the earlier report.
    assert not (folder / cfl_plots.IMAGES["gap"]).exists()
    assert not (folder / cfl_plots.IMAGES["similarity"]).exists()
    assert "cfl_gap.png" not in report and "cfl_similarity.png" not in report
    for name in ("norms", "accuracy", "tree"):
        assert (folder / cfl_plots.IMAGES[name]).exists()


def test_a_fedavg_report_has_no_cfl_section(tmp_path):
    out = tmp_path / "fedavg"
    run_config(tiny_config("fedavg", run={"checkpoint_every": 0}), out,
               data_dir=str(tmp_path / "data-root"))
    report = write_report(out).read_text()
    assert "## CFL" not in report
    assert not list(out.glob("cfl_*.png"))
