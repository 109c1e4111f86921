"""CFL's update cache (split_on "latest", spec A9): each member's latest update in its leaf,
with its round and sample count, so that a cluster larger than a round's sample can be tested
on every member; and the Gram matrix of those updates, kept so that a round recomputes only its
reporters' rows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from clusterfed.clustering.similarity import gram_matrix, update_gram

if TYPE_CHECKING:
    from clusterfed.algorithms.cfl.algorithm import CFLState


def remember_updates(state: CFLState, leaf: int, clients: np.ndarray, updates: np.ndarray,
                      samples: np.ndarray, rnd: int) -> tuple[CFLState, bool]:
    """Record this round's updates as the reporting members' latest (A9), and whether every
    member now has one."""
    members = state.nodes[leaf].members
    if leaf in state.latest_rounds:
        made = state.latest_rounds[leaf].copy()
        sizes = state.latest_samples[leaf].copy()
    else:
        made = np.full(len(members), -1, dtype=np.int64)
        sizes = np.zeros(len(members), dtype=np.int64)
    cached = state.latest_updates.get(leaf, {})
    if isinstance(cached, np.ndarray):   # a checkpoint from when rows were one array
        cached = {int(c): row for c, row, r in zip(members.tolist(), cached, made, strict=True)
                  if r >= 0}
    cached = {**cached, **{c: u.astype(np.float32)
                           for c, u in zip(clients.tolist(), updates, strict=True)}}
    rows = np.searchsorted(members, clients)
    made[rows], sizes[rows] = rnd, samples
    state = replace(state, latest_updates={**state.latest_updates, leaf: cached},
                    latest_rounds={**state.latest_rounds, leaf: made},
                    latest_samples={**state.latest_samples, leaf: sizes})
    return state, bool((made >= 0).all())


def latest_updates(state: CFLState, leaf: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every member's latest update (stacked in member order only here, when a split is tested
    on them), their sample counts and the rounds they were made."""
    rows = state.latest_updates[leaf]
    return (np.stack([rows[c] for c in state.nodes[leaf].members.tolist()]),
            state.latest_samples[leaf], state.latest_rounds[leaf])


def latest_gram(state: CFLState, leaf: int, latest: np.ndarray, changed: np.ndarray
                 ) -> tuple[CFLState, np.ndarray]:
    """The Gram matrix of the members' latest updates (`latest`, member order): whole the
    first time, then only the rows at positions `changed`, this round's reporters (p m d work
    a round where the whole matrix is m^2 d: at 10,000 members, 100 rows instead of 10,000)."""
    previous = state.latest_grams.get(leaf)
    gram = gram_matrix(latest) if previous is None else update_gram(previous, latest, changed)
    return replace(state, latest_grams={**state.latest_grams, leaf: gram}), gram
