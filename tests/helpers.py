"""Small configurations shared by the simulator, contract and CLI tests."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from clusterfed import config as cfg
from clusterfed.algorithms import RoundContext
from clusterfed.cli import entry
from clusterfed.models import FlatModel, build_model
from clusterfed.sim.executor import SequentialExecutor
from clusterfed.sim.simulation import initial_params
from clusterfed.tasks import TrainSpec

# The local training of hand-driven algorithm rounds (init / plan / update called directly).
SPEC = TrainSpec(lr=0.1, batch_size=10)


def ctx(rnd: int, sampled: Any, step: int = 0) -> RoundContext:
    """Round `rnd`'s context with clients `sampled`, at sub-step `step`."""
    return RoundContext(rnd, np.asarray(sampled), SPEC, step)


def tiny_config(algorithm: str = "fedavg", **sections: dict[str, Any]) -> dict[str, Any]:
    """Digits, label swap, 8 clients in 4 true clusters, a few quick rounds."""
    base = {
        "seed": 3,
        "data": {"dataset": "digits"},
        "scenario": {"kind": "label_swap", "clients": 8, "clusters": 4},
        "model": {"name": "digits_cnn"},
        "train": {"rounds": 4, "participation": 0.5, "local_epochs": 1, "batch_size": 16,
                  "lr": 0.1},
        "algorithm": {"name": algorithm},
        "run": {"progress": False, "checkpoint_every": 1},
    }
    return cfg.merge(cfg.merge(cfg.DEFAULTS, base), sections)


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary without its wall-clock time."""
    return {k: v for k, v in summary.items() if k != "wall_seconds"}


def cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """Run the command line in-process: (exit code, stdout, stderr)."""
    try:
        entry(list(argv))
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# The seed of the executors `executor_pair` builds.
EXECUTOR_SEED = 5


def uneven_digits() -> Any:
    """Digits, 6 clients of unequal sizes (quantity skew), so step counts and last batches
    differ: the executors that batch clients must mask and regroup them."""
    from clusterfed.data import build_federation, load_dataset
    return build_federation(load_dataset("digits"),
                            {"kind": "label_swap", "clients": 6, "clusters": 2,
                             "samples_per_client": 40, "test_samples_per_client": 15,
                             "quantity_skew": 0.6}, seed=1)


def executor_pair(federation: Any, executor: type, module: Any = None,
                  max_clients: int | None = None, transform: Any = None) -> tuple[Any, Any, Any]:
    """A sequential executor and one of class `executor`, each over its own copy of one seeded
    model (digits_cnn unless given), and that model's flat initial vector."""
    module = module or build_model("digits_cnn", federation.input_shape, federation.n_classes)
    initial_params(module, 0)
    seq = SequentialExecutor(FlatModel(copy.deepcopy(module)), federation, EXECUTOR_SEED,
                             transform)
    other = executor(FlatModel(copy.deepcopy(module)), federation, EXECUTOR_SEED, transform,
                     max_clients=max_clients)
    return seq, other, FlatModel(module).initial_vector().numpy()


def torch_reference_train(module: Any, x: torch.Tensor, y: torch.Tensor, spec: TrainSpec,
                          seed: int, prox_mu: float = 0.0, anchor: torch.Tensor | None = None
                          ) -> torch.Tensor:
    """torch.optim.SGD or Adam (the spec's optimizer, fresh) over the batch order train()
    promises (a fresh permutation per epoch), FedProx's (mu/2)||w - anchor||^2 added to the
    loss; the flat parameters after it."""
    model = copy.deepcopy(module)
    params = list(model.parameters())
    if spec.optimizer == "adam":
        opt = torch.optim.Adam(params, lr=spec.lr, betas=(spec.adam_beta1, spec.adam_beta2),
                               eps=spec.adam_eps, weight_decay=spec.weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum,
                              weight_decay=spec.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    n, b = len(y), spec.batch_size
    per_epoch = math.ceil(n / b)
    for step in range(spec.num_steps(n)):
        if step % per_epoch == 0:
            order = torch.randperm(n, generator=gen)
        idx = order[(step % per_epoch) * b:(step % per_epoch + 1) * b]
        opt.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if prox_mu:
            flat = torch.cat([p.reshape(-1) for p in params])
            loss = loss + prox_mu / 2 * torch.sum((flat - anchor) ** 2)
        loss.backward()
        if spec.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, spec.clip_grad_norm)
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def digits_client(samples: int) -> tuple[Any, FlatModel, torch.Tensor, torch.Tensor]:
    """A digits CNN (seed 0), its flat view and `samples` random 8x8 images with labels."""
    torch.manual_seed(0)
    module = build_model("digits_cnn", (1, 8, 8), 10)
    x = torch.rand(samples, 1, 8, 8)
    y = torch.randint(0, 10, (samples,))
    return module, FlatModel(module), x, y


def weak_groups(seed=0, noise=0.2, n=40, d=50):
    """Four equal groups of update directions (a shared direction plus one of four) under
    noise that puts every group's silhouette under 0.25, and the same clients with no groups."""
    rng = np.random.default_rng(seed)
    truth = np.arange(n) % 4
    shared = np.zeros(d)
    shared[10] = 3.0
    own = np.eye(d)[:4]
    grouped = (shared + own[truth] + noise * rng.normal(size=(n, d))).astype(np.float32)
    alike = (shared + noise * rng.normal(size=(n, d))).astype(np.float32)
    return truth, grouped, alike
