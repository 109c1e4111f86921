"""`compare` cut off and run again: finished runs read back, the cut-off one resumed."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import comparable, tiny_config

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.experiments import resumable
from clusterfed.experiments.compare import compare
from clusterfed.run_folder import CHECKPOINT, RunFolder


def test_a_rerun_comparison_keeps_finished_runs_and_resumes_the_cut_off_one(tmp_path: Path,
                                                                             monkeypatch):
    config = tiny_config("fedavg")
    first = compare(config, tmp_path, ["fedavg", "local"])
    # Cut `local` off after round 2: its logs end there and its checkpoint is round 2's.
    cut = tiny_config("local", train={"rounds": 2})
    compare(cut, tmp_path / "cut", ["local"])
    (tmp_path / "local" / "summary.json").unlink()
    (tmp_path / "cut" / "local" / CHECKPOINT).replace(tmp_path / "local" / CHECKPOINT)
    RunFolder(tmp_path / "local").truncate_after(2)
    resumed: list[Path] = []
    real = resumable.resume_run
    monkeypatch.setattr(resumable, "run_config", lambda *a, **k: pytest.fail("ran again"))
    monkeypatch.setattr(resumable, "resume_run",
                        lambda f, **k: resumed.append(f) or real(f, **k))
    again = compare(config, tmp_path, ["fedavg", "local"])
    assert resumed == [tmp_path / "local"]
    for name in ("fedavg", "local"):
        assert comparable(again["summaries"][name]) == comparable(first["summaries"][name])
    # Another evaluation would set other figures side by side: refused, not reused.
    with pytest.raises(ConfigError, match="another config .*eval"):
        compare(cfg.merge(config, {"eval": {"every": 2}}), tmp_path, ["fedavg"])
