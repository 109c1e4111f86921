"""The comparison plot keeps every method's line distinguishable."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from clusterfed.config import resolve
from clusterfed.report import plots

pytestmark = pytest.mark.fast


def test_quickstart_methods_get_panels_by_kind_and_legends_beside(tmp_path, monkeypatch):
    names = resolve("quickstart")["compare"]["algorithms"]   # 18 methods, tab10 has 10 colours
    runs = {name: [{"round": r, "mean_accuracy": 0.5} for r in (1, 2)] for name in names}
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    plots.compare_curves(runs, tmp_path / "accuracy.png")
    axes = drawn[0].axes
    assert [ax.get_title() for ax in axes] == ["clustered methods", "personalised methods",
                                               "drift-correcting methods"]
    labels = [[line.get_label() for line in ax.get_lines()] for ax in axes]
    assert all(panel[0] == "fedavg" for panel in labels)        # the reference in each
    assert "cfl" in labels[0] and "lg_fedavg" in labels[1] and "scaffold" in labels[2]
    assert sorted(n for panel in labels for n in panel[1:]) == sorted(set(names) - {"fedavg"})
    for ax in axes:
        pairs = {(str(line.get_color()), line.get_linestyle()) for line in ax.get_lines()}
        assert len(pairs) == len(ax.get_lines())                 # distinct within a panel
        legend = ax.get_legend()                                 # beside the curves
        assert legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1
    assert (tmp_path / "accuracy.png").exists()


def test_per_client_bars_tick_whole_clients_and_name_their_colours(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    plots.per_client_bars([0.5] * 20, [c // 5 for c in range(20)], tmp_path / "pc.png",
                          "true cluster")
    ax = drawn[0].axes[0]
    ticks = [t for t in ax.get_xticks() if 0 <= t < 20]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        f"true cluster {k}" for k in range(4)]


def test_line_styles_are_unique_up_to_their_limit():
    assert len(set(plots.line_styles(40))) == 40
    with pytest.raises(ValueError, match="distinguishable"):
        plots.line_styles(41)
