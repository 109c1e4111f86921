"""Client sampling and per-task seeds as pure functions of (seed, round, ...).

Nothing random is carried between rounds, so resuming needs no saved generator state.
"""

from __future__ import annotations

import numpy as np

_SAMPLE_TAG = 0x5A3B
_TASK_TAG = 0x7A5C


def clients_per_round(participation: float, num_clients: int) -> int:
    """A fraction in (0, 1] of the clients (at least one), or a count above 1."""
    if participation <= 0:
        raise ValueError("participation must be positive")
    if participation <= 1:
        return max(1, int(round(participation * num_clients)))
    return min(int(participation), num_clients)


def sample_clients(seed: int, round_index: int, num_clients: int, participation: float
                   ) -> np.ndarray:
    """Clients of one round, uniformly without replacement, sorted."""
    k = clients_per_round(participation, num_clients)
    if k == num_clients:
        return np.arange(num_clients)
    rng = np.random.default_rng([seed, round_index, _SAMPLE_TAG])
    return np.sort(rng.choice(num_clients, size=k, replace=False))


def task_seed(seed: int, round_index: int, step: int, client: int) -> int:
    """The seed of one client's batch order in one (round, step)."""
    return int(np.random.SeedSequence([seed, round_index, step, client, _TASK_TAG])
               .generate_state(1, dtype=np.uint64)[0] >> 1)
