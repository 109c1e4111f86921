"""CFL's similarity memory (acceptance "estimated"): a leaf's similarity matrix averaged over
recent rounds, on which a split is tested; noise in one round's similarities averages out, a
cluster structure persists.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from clusterfed.algorithms.cfl.algorithm import CFLState


def remember_similarity(state: CFLState, leaf: int, similarity: np.ndarray, memory: int
                        ) -> tuple[CFLState, np.ndarray, bool]:
    """The leaf's similarity, exponentially averaged over about `memory` rounds, and whether it
    already holds that many rounds."""
    rounds = state.similarity_rounds.get(leaf, 0) + 1
    previous = state.similarities.get(leaf)
    average = similarity if previous is None else previous + (
        similarity - previous) * (2.0 / (memory + 1))
    state = replace(state, similarities={**state.similarities, leaf: average},
                    similarity_rounds={**state.similarity_rounds, leaf: rounds})
    return state, average, rounds >= memory
