"""k models and the clients' choices among them, shared by the methods that keep several
models (IFCA, FeSEM, FlexCFL, FedEM): the starting models by an initialisation rule, and the
cluster each client is served from its latest choice.
"""

from __future__ import annotations

import numpy as np

from clusterfed.algorithms.base import Setup

# A client that has not chosen a model yet.
NEVER = -1
_NOISE_TAG = 0x1FCA


def initial_models(setup: Setup, count: int, rule: str, noise: float) -> np.ndarray:
    """`count` starting models (count x d) by the initialisation rule: `identical` copies of
    the initial model, the initial model `perturbed` by Gaussian noise of `noise` times its RMS,
    or `random` draws of the model's own initialisation (`Setup.draw_initial`)."""
    first = setup.initial_params.astype(np.float32)
    if rule == "identical":
        return np.repeat(first[None], count, axis=0)
    if rule == "perturbed":
        rng = np.random.default_rng([setup.seed, _NOISE_TAG])
        rms = float(np.sqrt(np.mean(first.astype(np.float64) ** 2))) or 1.0
        eps = rng.standard_normal((count, len(first)))
        return (first[None] + noise * rms * eps).astype(np.float32)
    if setup.draw_initial is None:
        raise ValueError("initialisation 'random' needs the runtime to draw initialisations "
                         "(Setup.draw_initial); use initialisation 'perturbed'")
    out = np.stack([np.asarray(setup.draw_initial(i), dtype=np.float32) for i in range(count)])
    if count > 1 and len({row.tobytes() for row in out}) < count:
        raise ValueError("initialisation 'random' drew identical models: the model has no "
                         "reset_parameters to draw from; use initialisation 'perturbed'")
    return out


def served_clusters(choice: np.ndarray) -> np.ndarray:
    """Latest choices; clients that never chose get the cluster most clients chose (else 0)."""
    known = choice[choice != NEVER]
    fallback = int(np.argmax(np.bincount(known))) if len(known) else 0
    return np.where(choice == NEVER, fallback, choice).astype(np.int64)
