"""The reproduction pages' generated tables match the committed run records, and the verdict
rule (docs/reproductions/README.md) on hand-worked cases."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusterfed.errors import ConfigError
from clusterfed.experiments import pages
from clusterfed.experiments.pages import generate, verdict

pytestmark = pytest.mark.fast

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reproductions"


def copy_of_docs(tmp_path: Path) -> Path:
    """The pages and the run records the declared tables read (not the other folders, whose
    older reproduce.json hold NaNs)."""
    docs = tmp_path / "reproductions"
    docs.mkdir()
    for page in DOCS.glob("*.md"):
        shutil.copy(page, docs / page.name)
    tables = yaml.safe_load(pages.DECLARATIONS.read_text())["tables"].values()
    folders = {t["runs"] for t in tables} | {r["runs"] for t in tables
                                              for r in t["rows"].values() if "runs" in r}
    for folder in folders:
        shutil.copytree(DOCS / "runs" / folder, docs / "runs" / folder,
                        ignore=shutil.ignore_patterns("*.jsonl"))
    return docs


def test_every_generated_block_matches_the_records() -> None:
    stale = [str(page.relative_to(DOCS)) for page, text in generate(DOCS).items()
             if page.read_text() != text]
    assert not stale, (f"{stale}: a generated table differs from the run records; run "
                       f"`python -m clusterfed.experiments.pages`")


def test_every_declared_table_is_on_its_page() -> None:
    declared = yaml.safe_load(pages.DECLARATIONS.read_text())["tables"]
    for name, spec in declared.items():
        assert f"<!-- generated: {name} -->" in (DOCS / spec["page"]).read_text(), name


def test_an_edited_figure_on_a_page_is_caught(tmp_path: Path) -> None:
    docs = copy_of_docs(tmp_path)
    page = docs / "pacfl.md"
    text = page.read_text()
    assert "97.27 ± 0.03" in text
    page.write_text(text.replace("97.27 ± 0.03", "97.47 ± 0.03", 1))
    assert pages.main(["--docs", str(docs), "--check"]) == 1
    assert pages.main(["--docs", str(docs)]) == 0
    assert page.read_text() == text


def test_a_block_without_a_declaration_is_refused(tmp_path: Path) -> None:
    docs = copy_of_docs(tmp_path)
    page = docs / "ifca.md"
    page.write_text(page.read_text() + "\n<!-- generated: gone -->\n<!-- end generated -->\n")
    with pytest.raises(ConfigError, match="gone"):
        generate(docs)
    assert pages.main(["--docs", str(docs), "--check"]) == 2


def test_a_changed_record_changes_the_table(tmp_path: Path) -> None:
    docs = copy_of_docs(tmp_path)
    summary = docs / "runs" / "pacfl-labelskew20-fmnist" / "pacfl" / "seed-0" / "summary.json"
    record = json.loads(summary.read_text())
    record["final"]["mean_accuracy"] = 0.9754   # seed 0 now at the paper's mean
    summary.write_text(json.dumps(record))
    regenerated = generate(docs)[docs / "pacfl.md"]
    # (97.54 + 97.30 + 97.2805) / 3 = 97.3735; sample std sqrt(0.04177 / 2) = 0.1445
    assert "97.37 ± 0.14 (97.54, 97.30, 97.28)" in regenerated


def test_the_tool_loads_no_torch() -> None:
    code = ("import sys; import clusterfed.experiments.pages; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(("paper", "ours", "seeds", "expected"), [
    # |97.29 - 97.15| = 0.14 <= 2 sqrt(0.01^2 + 0.11^2) = 0.2209
    ((97.15, 0.01), (97.29, 0.11), 3, "within (+0.14, limit 0.22)"),
    # |97.27 - 97.54| = 0.27 > 2 sqrt(0.08^2 + 0.03^2) = 0.1709
    ((97.54, 0.08), (97.27, 0.03), 3, "below (-0.27, limit 0.17)"),
    # 3-4-5: limit 2 * 5 = 10; a gap of exactly 10 is within, 10.5 above
    ((50.0, 3.0), (60.0, 4.0), 3, "within (+10.00, limit 10.00)"),
    ((50.0, 3.0), (60.5, 4.0), 3, "above (+10.50, limit 10.00)"),
    # a paper mean alone (std 0): our spread alone sets the limit
    ((90.0, 0.0), (89.0, 0.4), 5, "below (-1.00, limit 0.80)"),
    ((90.0, 1.0), (90.0, 0.0), 2, "not judged (2 seeds of 3)"),
    ((90.0, 1.0), (90.0, 0.0), 1, "not judged (1 seed of 3)"),
    ((90.0, 1.0), (float("nan"), float("nan")), 3, "not measured"),
])
def test_verdict_rule(paper: tuple[float, float], ours: tuple[float, float], seeds: int,
                      expected: str) -> None:
    assert verdict(paper, ours, seeds) == expected


def write_run(folder: Path, seed: int, own: float, served: float, clusters: int) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "seed": seed, "wall_seconds": 1.0,
        "final": {"mean_accuracy": own, "cluster_mean_accuracy": served},
        "clustering": {"n_clusters": clusters, "ari": 1.0}}))
    (folder / "config.yaml").write_text(yaml.safe_dump({
        "data": {"dataset": "mnist"}, "scenario": {"kind": "label_swap", "clients": 8},
        "train": {"rounds": 5, "local_epochs": 1, "participation": 0.5, "batch_size": 10,
                  "lr": 0.1, "momentum": 0.0},
        "eval": {"protocol": "local", "every": 1}}))


def test_a_declared_table_from_hand_made_records(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed, own in enumerate([0.90, 0.92, 0.94]):
        write_run(runs / "demo" / "ours" / f"seed-{seed}", seed, own, 0.5, 2)
    write_run(runs / "demo" / "theirs" / "seed-0", 0, 0.80, 0.70, 1)
    spec = {"page": "demo.md", "runs": "demo", "caption": "Table 9.", "protocol": "own",
            "protocol_text": "own model", "scale": "tiny",
            "rows": {"ours": {"name": "Ours"}, "theirs": {"name": "Theirs"},
                     "global": {"name": "Global", "not_comparable": "another setup",
                                "label": "theirs"}}}
    # A row's paper figure is its label's: Global reads Theirs' runs and figure.
    text = pages.table("demo", spec, {"ours": (93.0, 1.0), "theirs": (80.0, 0.0)}, runs)
    rows = [line for line in text.splitlines() if line.startswith("| ")][2:]
    # ours: mean 92, sample std 2; |92 - 93| = 1 <= 2 sqrt(1 + 4) = 4.47
    assert rows == [
        "| Ours | 93.00 ± 1.00 | 92.00 ± 2.00 (90.00, 92.00, 94.00) | 50.00 ± 0.00 (50.00, "
        "50.00, 50.00) | 0, 1, 2 | 2, 2, 2 | within (-1.00, limit 4.47) |",
        "| Theirs | 80.00 | 80.00 | 70.00 | 0 | 1 | not judged (1 seed of 3) |",
        "| Global | 80.00 | 80.00 | 70.00 | 0 | 1 | not comparable: another setup |"]
    assert "Recorded: mnist, `label_swap`, 8 clients, 5 rounds of 1 local epochs, 50 % of the " \
           "clients a round" in text


def test_a_table_takes_its_presets_protocol_and_not_comparable_rows() -> None:
    spec = {"preset": "pacfl-labelskew20-fmnist", "protocol": "own",
            "rows": {"fedavg": {"name": "FedAvg"}, "pacfl": {"name": "PACFL"}}}
    rows = pages.declared("t", spec)["rows"]
    assert rows["fedavg"]["not_comparable"].startswith("the paper's cell is NIID-Bench's")
    assert "not_comparable" not in rows["pacfl"]
    with pytest.raises(ConfigError, match="protocol 'cluster' differs from preset"):
        pages.declared("t", {**spec, "protocol": "cluster"})
