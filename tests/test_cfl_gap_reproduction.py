"""CFL Figs. 5 and 6 (separation gap against data size and rounds), checked at one seed.

The paper-scale record (3 seeds, variants) is docs/reproductions/cfl.md; this checks its claims
on seed 0 of the same preset: g grows with the points per client and with the rounds, weight
updates separate better than gradients, g > 0 at 200 points but not at 10 nor at 20, and
momentum 0.9 opens the gap within about 10 rounds where plain SGD does not.
"""

from __future__ import annotations

import json

import pytest

from clusterfed import config as cfg
from clusterfed.sim.simulation import run_config

pytestmark = [pytest.mark.shared_data, pytest.mark.reproduction]


def gaps(shared_data, folder, n: int, *extra: str) -> list[float]:
    """g (Eq. 48) of the one cluster after every round of plain FL."""
    config = cfg.resolve("cfl-gap-datasize", [f"data.root={shared_data}", "run.progress=false",
                                              "run.threads=1", "seed=0",
                                              f"scenario.samples_per_client={n}", *extra])
    run_config(config, folder)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r["separation_gap"]["0"] for r in rows if "separation_gap" in r]


def test_separation_gap_grows_with_data_and_rounds_and_updates_beat_gradients(shared_data,
                                                                              tmp_path):
    g = {n: gaps(shared_data, tmp_path / f"n{n}", n) for n in (10, 50, 200)}
    assert g[10][-1] < 0 < g[200][-1]
    assert g[10][-1] < g[50][-1] < g[200][-1]
    # Fig. 6: the gap opens with the rounds (means of 5 rounds, one round is noisy).
    assert sum(g[200][-5:]) > sum(g[200][:5])
    gradients = gaps(shared_data, tmp_path / "n50-gradients", 50,
                     "algorithm.similarity_from=gradients")
    assert g[50][-1] > gradients[-1]


def test_momentum_opens_the_gap_sooner_and_twenty_points_are_not_enough(shared_data, tmp_path):
    """Fig. 6's "about 10 rounds" holds with the reference code's momentum 0.9, not with plain
    SGD (recorded seed 0, rounds 10-15: mean g +0.29 against -0.25); Fig. 5's "as little as 20
    points" does not hold under either (g after round 50: -0.27 and -0.23)."""
    plain = gaps(shared_data, tmp_path / "n100", 100)
    momentum = gaps(shared_data, tmp_path / "n100-m", 100, "train.momentum=0.9")
    assert sum(momentum[9:15]) / 6 > 0 > sum(plain[9:15]) / 6
    assert gaps(shared_data, tmp_path / "n20", 20)[-1] < 0
    assert gaps(shared_data, tmp_path / "n20-m", 20, "train.momentum=0.9")[-1] < 0
