"""The control the Flower strategy tests are checked against.

With CLUSTERFED_STRATEGY_CONTROL=fedavg in the environment, the strategy tests run Flower's own
`FedAvg`, which averages all clients into one model, wherever they would run a clustered
strategy; every test that claims clusters must then fail (docs/flower-strategies.md, "How these
tests were checked"). Unset, the tests run the strategies as written.
"""

from __future__ import annotations

import os
from typing import Any

ENV = "CLUSTERFED_STRATEGY_CONTROL"
CONTROL = os.environ.get(ENV, "") == "fedavg"


def strategy_line(line: str, clients: int) -> str:
    """A ServerApp's strategy line, or under the control Flower's FedAvg on all `clients`."""
    if not CONTROL:
        return line
    return (f"FedAvg(min_available_nodes={clients}, min_train_nodes={clients}, "
            f"min_evaluate_nodes={clients})")


def under_test(strategy: Any, clients: int) -> Any:
    """`strategy`, or under the control Flower's FedAvg on all `clients`."""
    if not CONTROL:
        return strategy
    from flwr.serverapp.strategy import FedAvg
    return FedAvg(min_available_nodes=clients, min_train_nodes=clients,
                  min_evaluate_nodes=clients)


def assignment(result: Any, nodes: list[int]) -> list[int]:
    """Each node's cluster; one cluster for a strategy that has none (FedAvg's Result)."""
    found = getattr(result, "assignment", None)
    return [found[n] for n in nodes] if found is not None else [0] * len(nodes)
