"""`clusterfed reproduce`: a preset over its seeds, the table against the paper, resuming."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import cli, tiny_config

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.experiments import records, resumable
from clusterfed.experiments import reproduce as rep
from clusterfed.sim import simulation


def test_the_table_judges_by_the_pages_one_rule():
    """The rule stated once (records.verdict, docs/reproductions/README.md), by hand."""
    assert rep.verdict is records.verdict
    # |97.30 - 97.54| = 0.24 <= 2 sqrt(0.08^2 + 0.20^2) = 0.43
    assert rep.verdict((97.54, 0.08), (97.30, 0.20), 3) == "within (-0.24, limit 0.43)"
    # |89.76 - 77.3| = 12.46 > 2 sqrt(4.9^2 + 0.1^2) = 9.80
    assert rep.verdict((77.3, 4.9), (89.76, 0.1), 3) == "above (+12.46, limit 9.80)"
    assert rep.verdict((77.3, 4.9), (89.76, 0.1), 2) == "not judged (2 seeds of 3)"
    assert rep.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert rep.mean_std([4.0]) == (4.0, 0.0)


def small(tmp_config: dict | None = None) -> dict:
    config = tiny_config("fedavg", train={"rounds": 2}, run={"checkpoint_every": 1})
    return cfg.merge(config, {"reproduce": {"seeds": [0, 1], "algorithms": ["fedavg", "local"],
                                            "paper": {"fedavg": [50.0, 5.0], "local": 99.9}},
                              **(tmp_config or {})})


def test_runs_every_seed_and_tabulates_mean_and_std(tmp_path: Path, monkeypatch):
    result = rep.reproduce(small(), tmp_path)
    rows = {r["label"]: r for r in result["rows"]}
    for label in ("fedavg", "local"):
        own = [100 * json.loads((tmp_path / label / f"seed-{s}" / "summary.json").read_text()
                                )["final"]["mean_accuracy"] for s in (0, 1)]
        assert rows[label]["own"] == pytest.approx((np.mean(own), np.std(own, ddof=1)))
    # Seeds give different federations and models.
    assert rows["fedavg"]["runs"][0]["own"] != rows["fedavg"]["runs"][1]["own"]
    assert rows["local"]["paper"] == (99.9, 0.0)
    assert rows["local"]["verdict"] == "not judged (2 seeds of 3)"
    text = (tmp_path / "reproduce.md").read_text()
    assert "| fedavg | 50.00 ± 5.00 |" in text and "with our `own` one" in text
    # Rerun: every finished run is read back, none trained again.
    monkeypatch.setattr(resumable, "run_config", lambda *a, **k: pytest.fail("ran again"))
    lines: list[str] = []
    again = rep.reproduce(small(), tmp_path, progress=lines.append)
    assert rep.markdown(again) == rep.markdown(result)
    # Each run's line names its protocol's figure; no served-model figure was asked for.
    first = rows["fedavg"]["runs"][0]["own"]
    assert lines[0].startswith(f"fedavg seed 0: {first:.2f} % (cluster protocol), 1 clusters")
    assert "nan" not in "".join(lines)


def test_one_protocol_judges_every_row_and_a_row_not_comparable_gets_its_reason():
    def run(own: float, served: float) -> dict:
        return rep.figures({"final": {"mean_accuracy": own, "cluster_mean_accuracy": served},
                            "clustering": {"ari": 1.0, "n_clusters": 2}, "wall_seconds": 1.0})

    config = cfg.merge(cfg.DEFAULTS, {"reproduce": {
        "paper": {"a": [70.0, 1.0], "b": [90.0, 1.0]}, "protocol": "cluster",
        "not_comparable": {"b": "a global model's figure"}}})
    runs = [run(0.9, 0.7), run(0.9, 0.7), run(0.9, 0.7)]
    result = rep.summarise(config, {"a": runs, "b": runs}, [0, 1, 2])
    rows = {row["label"]: row for row in result["rows"]}
    # a: its served figure (70) is read, not its own (90)
    assert rows["a"]["verdict"] == "within (+0.00, limit 2.00)"
    assert rows["b"]["verdict"] == "not comparable: a global model's figure"
    assert "with our `cluster` one" in rep.markdown(result)


def test_a_mixture_scenario_adds_the_shares_error_column():
    def run(own: float, error: float | None) -> dict:
        clustering = {"ari": 1.0, "n_clusters": 2,
                      **({} if error is None else {"shares_error": error})}
        return rep.figures({"final": {"mean_accuracy": own}, "clustering": clustering,
                            "wall_seconds": 1.0})

    config = cfg.merge(cfg.DEFAULTS, {})
    mixed = rep.summarise(config, {"fedsoft": [run(0.5, 0.04), run(0.6, 0.06)],
                                   "fedavg": [run(0.5, 0.5), run(0.5, 0.5)]}, [0, 1])
    text = rep.markdown(mixed)
    assert "| shares error |" in text and "| 0.050 ± 0.014 |" in text
    assert "| 0.500 ± 0.000 |" in text
    plain = rep.markdown(rep.summarise(config, {"fedavg": [run(0.5, None)]}, [0]))
    assert "shares error" not in plain


def test_a_cut_off_run_resumes_and_another_config_is_refused(tmp_path: Path, monkeypatch):
    rep.reproduce(small(), tmp_path)
    folder = tmp_path / "local" / "seed-1"
    whole = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").unlink()         # cut off after its last checkpoint
    resumed = []
    real = resumable.resume_run
    monkeypatch.setattr(resumable, "resume_run", lambda f, **k: resumed.append(f) or real(f, **k))
    rep.reproduce(small(), tmp_path)
    assert resumed == [folder]
    again = json.loads((folder / "summary.json").read_text())
    assert again["final"] == whole["final"]
    with pytest.raises(ConfigError, match="holds a run of another config"):
        rep.reproduce(cfg.merge(small(), {"train": {"lr": 0.2}}), tmp_path)
    # Newcomers trained otherwise are another run too.
    late = {"newcomers": {"clients": [0], "join_round": 1, "finetune_rounds": 2}}
    with pytest.raises(ConfigError, match="holds a run of another config"):
        rep.reproduce(cfg.merge(small(), late), tmp_path)


@pytest.mark.parametrize("section, message", [
    ({"seed": [0]}, "unknown keys"), ({"seeds": []}, "non-empty"),
    ({"paper": {"pacfl": "97"}}, "mean or"), ({"protocol": "global"}, "own, cluster"),
    ({"not_comparable": {"fedavg": ""}}, "each label to its reason"),
    ({"paper_protocol": {"fedavg": "cluster"}}, "replaced by one a table: reproduce.protocol")])
def test_bad_sections_are_config_errors(section, message, tmp_path: Path):
    with pytest.raises(ConfigError, match=message):
        rep.reproduce(cfg.merge(tiny_config(), {"reproduce": section}), tmp_path)


def test_command_line_writes_the_table(capsys, tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_text(cfg.dump(small()))
    code, out, err = cli(capsys, "reproduce", str(path), "--seeds", "3", "--algorithms",
                         "fedavg", "--out", str(tmp_path / "r"))
    assert code == 0, err
    # The table holds the preset's seeds and algorithms besides those run.
    assert "Seeds 0, 1, 3" in out and "fedavg seed 3:" in err
    assert "| fedavg (seed 3) | 50.00 ± 5.00 |" in out
    assert "| local (no finished run) | 99.90 ± 0.00 | - |" in out
    assert (tmp_path / "r" / "fedavg" / "seed-3" / "summary.json").exists()


def test_every_presets_paper_figures_name_algorithms_it_runs():
    """A paper figure under a label no run carries would never reach the table."""
    from clusterfed.experiments.reproduce import runs_of
    checked = 0
    for name in cfg.preset_names():
        config = cfg.resolve(name)
        section = config.get("reproduce") or {}
        labels = {label for label, _ in runs_of(config)}
        for key in ("paper", "not_comparable"):
            assert set(section.get(key) or {}) <= labels, (name, key, labels)
        checked += bool(section.get("paper"))
    assert checked >= 3


def test_finished_tabulates_the_finished_runs_and_runs_nothing(capsys, tmp_path: Path,
                                                              monkeypatch):
    path = tmp_path / "p.yaml"
    path.write_text(cfg.dump(small()))
    # fedavg has seeds 0 and 1, local seed 1 only.
    code, _, err = cli(capsys, "reproduce", str(path), "--seeds", "0,1", "--algorithms",
                       "fedavg", "--out", str(tmp_path / "r"))
    assert code == 0, err
    code, _, err = cli(capsys, "reproduce", str(path), "--seeds", "1", "--algorithms",
                       "local", "--out", str(tmp_path / "r"))
    assert code == 0, err
    # Running local's seed kept fedavg's finished rows in the folder's table.
    kept = (tmp_path / "r" / "reproduce.md").read_text()
    assert "| fedavg | 50.00 ± 5.00 |" in kept and "| local (seed 1) |" in kept
    # Rows in the preset's order, not the named algorithm first.
    assert kept.index("| fedavg |") < kept.index("| local (seed 1) |")
    monkeypatch.setattr(resumable, "run_config", lambda *a, **k: pytest.fail("ran"))
    monkeypatch.setattr(simulation, "build_federation_for", lambda *a, **k: pytest.fail("built"))
    ran = (tmp_path / "r" / "config.yaml").read_text()
    code, out, err = cli(capsys, "reproduce", str(path), "--seeds", "0,1,2", "--out",
                         str(tmp_path / "r"), "--finished", "run.threads=2")
    assert code == 0, err
    assert (tmp_path / "r" / "config.yaml").read_text() == ran   # the record of what ran
    assert "Seeds 0, 1, 2" in out
    assert "| fedavg (seeds 0, 1) | 50.00 ± 5.00 |" in out
    assert "| local (seed 1) | 99.90 ± 0.00 |" in out
    rows = {r["label"]: r for r in json.loads((tmp_path / "r" / "reproduce.json").read_text()
                                              )["rows"]}
    assert rows["fedavg"]["seeds"] == [0, 1] and len(rows["fedavg"]["runs"]) == 2
    summaries = [json.loads((tmp_path / "r" / "fedavg" / f"seed-{s}" / "summary.json")
                            .read_text())["final"]["mean_accuracy"] for s in (0, 1)]
    assert rows["fedavg"]["own"][0] == pytest.approx(100 * np.mean(summaries))
    none = rep.reproduce(small(), tmp_path / "none", seeds=[5], finished_only=True)
    assert "Seeds 0, 1, 5" in rep.markdown(none)
    assert "| fedavg (no finished run) | 50.00 ± 5.00 | - |" in rep.markdown(none)


def test_a_finished_run_of_another_config_is_left_out_of_the_table(tmp_path: Path):
    other = cfg.merge(small(), {"train": {"rounds": 1}})
    rep.reproduce(other, tmp_path, names=["fedavg"], seeds=[0])
    lines: list[str] = []
    result = rep.reproduce(small(), tmp_path, names=["local"], seeds=[0], progress=lines.append)
    rows = {r["label"]: r for r in result["rows"]}
    assert rows["fedavg"]["seeds"] == [] and rows["local"]["seeds"] == [0]
    assert any(line.startswith("fedavg seed 0: left out of the table") for line in lines)


def test_a_run_another_command_finishes_meanwhile_joins_the_table(tmp_path: Path, monkeypatch):
    """Two commands side by side into one folder: the one that ends last writes a table with
    the other's finished run, and not a run of another config that finished there."""
    rep.reproduce(small(), tmp_path / "side", names=["fedavg"], seeds=[0])
    other = cfg.merge(small(), {"train": {"rounds": 1}})
    rep.reproduce(other, tmp_path / "other", names=["fedavg"], seeds=[1])
    real = rep.run_jobs

    def beside(*args, **kwargs):
        # The other command finishes its runs while this one trains.
        for source, seed in (("side", 0), ("other", 1)):
            shutil.copytree(tmp_path / source / "fedavg" / f"seed-{seed}",
                            tmp_path / "r" / "fedavg" / f"seed-{seed}")
        return real(*args, **kwargs)

    monkeypatch.setattr(rep, "run_jobs", beside)
    result = rep.reproduce(small(), tmp_path / "r", names=["local"], seeds=[0])
    rows = {r["label"]: r for r in result["rows"]}
    assert rows["fedavg"]["seeds"] == [0] and rows["local"]["seeds"] == [0]
    side = json.loads((tmp_path / "side" / "fedavg" / "seed-0" / "summary.json").read_text())
    assert rows["fedavg"]["own"][0] == pytest.approx(100 * side["final"]["mean_accuracy"])
    assert "| fedavg (seed 0) | 50.00 ± 5.00 |" in (tmp_path / "r" / "reproduce.md"
                                                  ).read_text()
    assert not list((tmp_path / "r").glob("*.tmp"))   # no partial file left behind
