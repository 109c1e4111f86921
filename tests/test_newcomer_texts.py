"""What a newcomer reads first (issue 60): the comparison report's top, the presets list, the
benchmark's help, and a rerun of `make run` that says what it reused."""

from __future__ import annotations

from helpers import cli

from clusterfed.cli import preset_summary
from clusterfed.experiments.benchmark import QUICK

SMALL = ["scenario.clients=8", "train.rounds=1", "run.progress=false",
         "--algorithms", "fedavg,local"]


def test_the_comparison_report_says_what_the_federation_is_and_what_ari_means(capsys,
                                                                              tmp_path):
    code, out, err = cli(capsys, "compare", "quickstart", *SMALL, "--out", str(tmp_path))
    assert code == 0, err
    assert "reused" not in out
    top = (tmp_path / "report.md").read_text().split("```")[0]
    assert "digits" in top and "label_swap" in top and "8 clients in 4 true clusters" in top
    assert "ARI (adjusted Rand index)" in top
    # Run again into the same folder: the finished runs are reused, and it says so.
    code, out, err = cli(capsys, "compare", "quickstart", *SMALL, "--out", str(tmp_path))
    assert code == 0, err
    assert "reused 2 of 2 finished runs" in out and "fedavg, local" in out


def test_preset_descriptions_are_never_cut_inside_parentheses():
    text = ("# Small scale of x (Table 1, CIFAR10 column) for 2 cores: 200 images per\n"
            "# client (not all), 2 epochs. More words here.\nseed: 0\n")
    assert preset_summary(text) == ("Small scale of x (Table 1, CIFAR10 column) for 2 cores: "
                                    "200 images per client (not all), 2 epochs.")
    long = "# A (b. c), " + ", ".join(["word"] * 60) + ".\n"
    short = preset_summary(long, width=40)
    assert short.endswith(" ...") and short.count("(") == short.count(")")
    assert len(short) <= 44
    assert preset_summary("# CFL paper (Sattler et al., 2020) Fig. 9: AG News.\n") == \
        "CFL paper (Sattler et al., 2020) Fig. 9: AG News."


def test_presets_lines_keep_their_parentheses_balanced(capsys):
    code, out, _ = cli(capsys, "presets")
    assert code == 0
    for line in out.splitlines():
        assert line.count("(") == line.count(")"), line


def test_benchmark_help_counts_the_quick_scenarios_it_runs(capsys):
    code, out, _ = cli(capsys, "benchmark", "--help")
    assert code == 0
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"{words[len(QUICK['scenarios'])]} scenarios" in " ".join(out.split())


def test_flhc_table_shows_the_first_evaluated_round_after_clustering_not_a_row_of_na():
    from clusterfed.algorithms.flhc.report import comparison_rows

    # Evaluation every 5 rounds; the clustering round starts round 11 (not evaluated).
    fedavg = [{"round": r, **({"mean_accuracy": r / 100} if r % 5 == 0 else {})}
              for r in range(1, 21)]
    flhc = [{**m, **({"flhc_clustering": True} if m["round"] == 11 else {})} for m in fedavg]
    rows = comparison_rows(fedavg, [{**m, "mean_accuracy": 0.3} if "mean_accuracy" in m
                                    else m for m in flhc])
    assert [(r["label"], r["round"]) for r in rows] == [
        ("first evaluated after clustering", 15), ("last", 20)]
    assert rows[0]["flhc"]["mean_accuracy"] == 0.3 and rows[0]["accuracy_ratio"] == "2.00x"
