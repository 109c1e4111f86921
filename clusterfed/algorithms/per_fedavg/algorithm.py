"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020), Algorithm 1.

The federation learns w minimising (1/n) sum_i F_i(w - alpha grad F_i(w)): a model from which one
local gradient step personalises well. Each sampled client takes tau local meta steps
    w~ = w - alpha grad f_i(w, D);  w <- w - beta (I - alpha H_i(w, D'')) grad f_i(w~, D')
with the Hessian term dropped ('fo', Per-FedAvg (FO)) or replaced by a central difference of
gradients ('hf', Per-FedAvg (HF)); the server averages the clients' models (uniformly, as in
Algorithm 1). At test time each client personalises with `personal_steps` (the paper: one)
gradient steps of size alpha on its training data before it is tested.

tau is the round's number of local steps (train.local_steps, or local_epochs times the batches
per epoch); each meta step draws 2 ('fo') or 3 ('hf') batches, so an epoch of meta steps reads
the data 2 or 3 times (`epoch: batches`). The outer step beta defaults to train.lr (its
momentum and weight decay apply to the meta-gradient: `momentum: meta`); alpha defaults to
train.lr too. PACFL (Table 13): alpha = 1e-2, beta = 1e-3.

The PACFL authors' Per-FedAvg (src/client/client_per_fedavg.py, from the pFedMe code base)
differs in two ways, each an option here and both set by the PACFL presets: an epoch is one
pass over the data, `len(ldr_train) // 2` meta steps of two batches (`epoch: pass`), and one
SGD optimiser takes the inner and the outer step, so its momentum buffer carries the inner
gradients into the outer step (`momentum: shared`, first order only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from clusterfed.algorithms.aggregate import Weighting, aggregation_weights
from clusterfed.algorithms.base import ALGORITHMS, ClusterView, RoundContext, Setup, Update
from clusterfed.algorithms.fedavg.algorithm import FedAvgState, apply_updates
from clusterfed.tasks import (
    MAML_BATCHES,
    MAML_MOMENTA,
    MAML_VARIANTS,
    ClientResult,
    ClientTask,
    LocalObjective,
    TaskKind,
    TrainSpec,
)

# What an epoch of meta steps is: a step a batch (reading the data 2 or 3 times), or one pass.
EPOCHS = ("batches", "pass")


@ALGORITHMS.register("per_fedavg")
@dataclass(frozen=True)
class PerFedAvg:
    variant: str = "fo"            # "fo" (first order) or "hf" (Hessian-free)
    alpha: float | None = None     # inner and personalisation step; None: train.lr
    beta: float | None = None      # outer (meta) step; None: train.lr
    delta: float = 1e-3            # the HF variant's finite-difference step
    personal_steps: int = 1        # gradient steps of personalisation before testing
    weighting: Weighting = "uniform"  # Algorithm 1's plain mean, or "samples"
    epoch: str = "batches"         # "batches": a meta step a batch; "pass": one data pass
    momentum: str = "meta"         # "meta": on the meta-gradient; "shared": inner step too

    def __post_init__(self) -> None:
        if self.variant not in MAML_VARIANTS:
            raise ValueError(f"variant must be one of {MAML_VARIANTS}, got {self.variant!r}")
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive or null, got {value}")
        if not self.delta > 0:
            raise ValueError(f"delta must be positive, got {self.delta}")
        if self.personal_steps < 0:
            raise ValueError(f"personal_steps must be >= 0, got {self.personal_steps}")
        aggregation_weights(np.ones(1), self.weighting)
        if self.epoch not in EPOCHS:
            raise ValueError(f"epoch must be one of {EPOCHS}, got {self.epoch!r}")
        if self.momentum not in MAML_MOMENTA:
            raise ValueError(f"momentum must be one of {MAML_MOMENTA}, got {self.momentum!r}")
        if self.momentum == "shared" and self.variant != "fo":
            raise ValueError("momentum: shared steps the inner and the outer step through one "
                             "optimiser, the first-order variant's (variant: fo)")

    def init(self, setup: Setup) -> FedAvgState:
        return FedAvgState(setup.initial_params.copy(), setup.num_clients)

    def plan(self, state: FedAvgState, ctx: RoundContext) -> list[ClientTask]:
        spec = replace(ctx.train, lr=self.beta or ctx.train.lr,
                       batches_per_step=MAML_BATCHES[self.variant] if self.epoch == "pass"
                       else 1)
        objective = LocalObjective(maml=self.variant, maml_alpha=self.alpha or ctx.train.lr,
                                   maml_delta=self.delta, maml_momentum=self.momentum)
        return [ClientTask(int(c), TaskKind.TRAIN, state.model, spec, objective=objective)
                for c in ctx.sampled]

    def update(self, state: FedAvgState, ctx: RoundContext, results: Sequence[ClientResult]
               ) -> Update:
        return Update(replace(state, model=apply_updates(state.model, results, self.weighting)))

    def adaptation(self, state: FedAvgState, train: TrainSpec) -> TrainSpec | None:
        """One (or `personal_steps`) plain gradient step of size alpha on a training batch."""
        if not self.personal_steps:
            return None
        return replace(train, lr=self.alpha or train.lr, epochs=None, steps=self.personal_steps,
                       momentum=0.0)

    def clusters(self, state: FedAvgState) -> ClusterView:
        return ClusterView(state.model[None], np.zeros(state.num_clients, dtype=np.int64))
