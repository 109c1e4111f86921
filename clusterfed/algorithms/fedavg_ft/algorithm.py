"""FedAvg with local fine-tuning: FedAvg's training, and at evaluation each client fine-tunes
the global model on its own training data before it is tested (a strong personalised baseline;
e.g. Wang et al. 2019, "Federated Evaluation of On-device Personalization"; Yu et al. 2020,
"Salvaging Federated Learning by Local Adaptation").

The fine-tuning is the round's local SGD (its lr, momentum and batch size) for
`finetune_epochs` epochs, or `finetune_steps` steps when set; `finetune_lr` replaces the lr.
It never changes the global model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from clusterfed.algorithms.base import ALGORITHMS
from clusterfed.algorithms.fedavg.algorithm import FedAvg, FedAvgState
from clusterfed.tasks import TrainSpec


@ALGORITHMS.register("fedavg_ft")
@dataclass(frozen=True)
class FedAvgFT(FedAvg):
    finetune_epochs: int = 1
    finetune_steps: int | None = None   # when set, steps instead of epochs
    finetune_lr: float | None = None    # None: the round's train.lr

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.finetune_epochs < 1 or (self.finetune_steps is not None
                                        and self.finetune_steps < 1):
            raise ValueError("finetune_epochs and finetune_steps must be at least 1")
        if self.finetune_lr is not None and not self.finetune_lr > 0:
            raise ValueError(f"finetune_lr must be positive or null, got {self.finetune_lr}")

    def adaptation(self, state: FedAvgState, train: TrainSpec) -> TrainSpec:
        steps = self.finetune_steps
        return replace(train, lr=self.finetune_lr or train.lr,
                       epochs=None if steps else self.finetune_epochs, steps=steps)
