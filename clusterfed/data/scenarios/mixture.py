"""Soft clusters: every client's data are a mixture of S sources (FedSoft's headline setting).

Source s is the data rotated by `angles[s]` (default 360 s / S degrees); a client's shares over
the sources follow one rule (the authors' code, ycruan/FedSoft `clients_preparation.py`):

- `linear` (S = 2): client i holds a share (i + 0.5) / n of source 0 and the rest of source 1
  (`create_clients_mnist_and_mnist_rotation_90`);
- a list of share vectors, one per even block of clients: `[[0.3, 0.7], [0.7, 0.3]]` is the
  authors' CIFAR-10 and EMNIST-letters split (the first half 30 % source 0, the second 70 %);
- `dirichlet`: each client's shares ~ Dir(alpha 1_S); alpha 1 is the authors' 4- and 8-set
  rule (sorted uniform cut points).

A client's train and test data follow its shares alike (`transforms.Mixed`, the authors'
rounding). The true cluster of a client is its dominant source (argmax of its shares, the
first on a tie); `info["shares"]` keeps every client's shares, against which a run scores
the weights a method estimates (`clustering.shares_error`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from clusterfed.data.datasets import Dataset
from clusterfed.data.scenarios.assignment import (
    Assignment,
    ClientSpec,
    ScenarioPlan,
    fill,
    label_partition,
    need_images,
    whole_pool,
)
from clusterfed.data.scenarios.building import SCENARIOS
from clusterfed.data.transforms import Mixed, Rotate
from clusterfed.errors import ConfigError

SHARE_RULES = ("linear", "dirichlet")


@SCENARIOS.register("mixture")
def mixture(dataset: Dataset, *, assign: Assignment, rng: np.random.Generator,
            angles: Sequence[float] | None = None, shares: Any = "linear",
            alpha: float = 1.0) -> ScenarioPlan:
    """Each client a mixture of S = scenario.clusters rotated sources, by the rule `shares`."""
    need_images(dataset, "scenario 'mixture'")
    if assign.membership is not None:
        raise ConfigError("scenario 'mixture' has no drift: a client's source is per sample")
    s = assign.clusters
    angles = [360.0 * j / s for j in range(s)] if angles is None else [float(a) for a in angles]
    if len(angles) != s:
        raise ConfigError(f"scenario.angles has {len(angles)} angles for {s} sources "
                          f"(scenario.clusters)")
    # A child stream: the data are shared out by the same draws whatever the share rule.
    share_rng = rng.spawn(1)[0]
    table = client_shares(shares, assign.clients, s, alpha, share_rng)
    partition, _ = label_partition(None)
    train, test, info = fill(dataset, assign, rng, [whole_pool(dataset, range(assign.clients))],
                             partition)
    parts = tuple(Rotate(a) for a in angles)
    dominant = np.argmax(table, axis=1)
    specs = [ClientSpec(tr, te, Mixed(tuple(float(v) for v in row), parts), int(c))
             for tr, te, row, c in zip(train, test, table, dominant, strict=True)]
    rule = shares if isinstance(shares, str) else "blocks"
    return ScenarioPlan(specs, {**info, "angles": angles, "share_rule": rule,
                                **({"alpha": float(alpha)} if rule == "dirichlet" else {}),
                                "shares": np.round(table, 6).tolist()})


def client_shares(rule: Any, n: int, s: int, alpha: float, rng: np.random.Generator
                  ) -> np.ndarray:
    """(n, S) shares, each row summing to 1, by the rule (see the module docstring)."""
    if isinstance(rule, str):
        if rule == "linear":
            if s != 2:
                raise ConfigError(f"scenario.shares=linear mixes 2 sources (the authors' MNIST "
                                  f"setting); scenario.clusters is {s}")
            first = (np.arange(n) + 0.5) / n
            return np.stack([first, 1.0 - first], axis=1)
        if rule == "dirichlet":
            if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
                raise ConfigError(f"scenario.alpha (the Dirichlet concentration of the "
                                  f"shares) must be a number > 0, got {alpha!r}")
            return rng.dirichlet(np.full(s, float(alpha)), size=n)
        raise ConfigError(f"unknown scenario.shares {rule!r}; valid: {', '.join(SHARE_RULES)}, "
                          f"or a list of share vectors, one per block of clients")
    blocks = _share_vectors(rule, s)
    if len(blocks) > n:
        raise ConfigError(f"scenario.shares has {len(blocks)} blocks for {n} clients")
    return blocks[np.arange(n) * len(blocks) // n]


def _share_vectors(raw: Any, s: int) -> np.ndarray:
    bad = ConfigError(f"scenario.shares must be linear, dirichlet or a list of vectors of "
                      f"{s} shares >= 0 summing to 1 (one per source), got {raw!r}")
    if not isinstance(raw, Sequence) or not raw:
        raise bad
    try:
        table = np.array(raw, dtype=np.float64)
    except (TypeError, ValueError):
        raise bad from None
    if table.ndim != 2 or table.shape[1] != s or (table < 0).any() \
            or not np.allclose(table.sum(axis=1), 1.0, atol=1e-6):
        raise bad
    return table
