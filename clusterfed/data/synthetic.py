"""FedEM's synthetic mixture dataset (Marfoq et al., NeurIPS 2021, Section 4 "Datasets and
models" and the Table 2 "Synthetic" column), one group per client (task).

The generative model (the paper's Assumption 1 with linear components):
  M components theta_m ~ U[-1, 1]^d;  client t's mixture weights pi_t ~ Dir(alpha 1_M);
  client t holds n_t = min(floor(LogNormal(4, 2)) + 50, 1000) training samples;
  each sample: x ~ U[-1, 1]^d, z ~ Categorical(pi_t), y = round(sigmoid(<x, theta_z> + eps)),
  eps ~ N(0, noise_level^2);  binary labels.
Defaults are the authors' Table 2 split (omarfoq/FedEM data/synthetic/README.md: 300 clients,
M = 3, d = 150, noise 0.1, alpha 0.4, 5,000 test samples per client, generator seed 12345).

Deviation, and why: the authors' generator draws z per sample but then labels the same leading
block of samples with every component in turn (its slice start never moves), so its labels are
not the mixture it describes; here every sample is labelled by its own z, the paper's model.
`n_test` defaults to the authors' 5,000 per client; the presets lower it (memory: 300 x 5,000
x 150 floats are 0.9 GB).

Each client is a group (train_groups / test_groups = t), so scenario `writers` makes one
federation client per generated client; the group's true cluster (meta["group_clusters"]) is
its dominant component argmax_m pi_t,m, and meta holds theta and pi.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clusterfed.data.datasets import DATASETS, Dataset
from clusterfed.errors import ConfigError

BOX = (-1.0, 1.0)


def sample_sizes(rng: np.random.Generator, n_clients: int, min_samples: int = 50,
                 max_samples: int = 1000) -> np.ndarray:
    """n_t = min(floor(LogNormal(4, 2)) + min_samples, max_samples) per client."""
    drawn = np.floor(rng.lognormal(4.0, 2.0, n_clients)).astype(np.int64)
    return np.minimum(drawn + min_samples, max_samples)


def mixture_labels(x: np.ndarray, z: np.ndarray, theta: np.ndarray, noise: np.ndarray
                   ) -> np.ndarray:
    """y_i = round(sigmoid(<x_i, theta_{z_i}> + noise_i)), i.e. 1 where the logit is > 0."""
    logits = np.einsum("nd,nd->n", x, theta[z]) + noise
    return (logits > 0).astype(np.int64)


def client_samples(rng: np.random.Generator, pi: np.ndarray, theta: np.ndarray, n: int,
                   noise_level: float) -> tuple[np.ndarray, np.ndarray]:
    """n samples of one client: uniform inputs, each labelled by its own component z ~ pi."""
    x = rng.uniform(BOX[0], BOX[1], size=(n, theta.shape[1]))
    z = rng.choice(len(pi), size=n, p=pi)
    y = mixture_labels(x, z, theta, rng.normal(0.0, noise_level, size=n))
    return x.astype(np.float32), y


@DATASETS.register("fedem_synthetic")
def load_fedem_synthetic(root: Path | None = None, clients: int = 300, components: int = 3,
                         dimension: int = 150, noise_level: float = 0.1, alpha: float = 0.4,
                         n_test: int = 5000, seed: int = 12345) -> Dataset:
    """The mixture dataset generated from `seed` (the data's own seed, not the run's)."""
    for name, value in (("clients", clients), ("components", components),
                        ("dimension", dimension), ("n_test", n_test)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"data.{name} must be a whole number >= 1, got {value!r}")
    if not alpha > 0 or not noise_level >= 0:
        raise ConfigError(f"data.alpha must be > 0 and data.noise_level >= 0, got "
                          f"{alpha!r}, {noise_level!r}")
    rng = np.random.default_rng(seed)
    pi = rng.dirichlet(alpha * np.ones(components), size=clients)
    theta = rng.uniform(BOX[0], BOX[1], size=(components, dimension))
    sizes = sample_sizes(rng, clients)
    parts = [(client_samples(rng, pi[t], theta, int(sizes[t]), noise_level),
              client_samples(rng, pi[t], theta, n_test, noise_level)) for t in range(clients)]
    train_x = np.concatenate([tr[0] for tr, _ in parts])
    train_y = np.concatenate([tr[1] for tr, _ in parts])
    test_x = np.concatenate([te[0] for _, te in parts])
    test_y = np.concatenate([te[1] for _, te in parts])
    groups = np.arange(clients, dtype=np.int64)
    return Dataset("fedem_synthetic", train_x, train_y, test_x, test_y, 2,
                   train_groups=np.repeat(groups, sizes),
                   test_groups=np.repeat(groups, n_test),
                   meta={"group_clusters": {int(t): int(np.argmax(pi[t])) for t in groups},
                         "pi": pi.tolist(), "theta": theta.tolist(),
                         "groups": [str(t) for t in groups]})
