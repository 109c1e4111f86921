"""The comparison plot keeps every method's line distinguishable."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from clusterfed.config import resolve
from clusterfed.report import plots

pytestmark = pytest.mark.fast


def test_quickstart_methods_get_distinct_colour_and_style(tmp_path, monkeypatch):
    names = resolve("quickstart")["compare"]["algorithms"]   # 13 methods, tab10 has 10 colours
    runs = {name: [{"round": r, "mean_accuracy": 0.5} for r in (1, 2)] for name in names}
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    plots.compare_curves(runs, tmp_path / "accuracy.png")
    lines = drawn[0].axes[0].get_lines()
    assert [line.get_label() for line in lines] == list(names)
    pairs = {(tuple(line.get_color()), line.get_linestyle()) for line in lines}
    assert len(pairs) == len(names)
    assert (tmp_path / "accuracy.png").exists()


def test_line_styles_are_unique_up_to_their_limit():
    assert len(set(plots.line_styles(40))) == 40
    with pytest.raises(ValueError, match="distinguishable"):
        plots.line_styles(41)
