"""Server logic only: each algorithm plans client tasks and updates an explicit state."""

# The methods, one folder each and one line here: importing a folder registers its method
# (docs/design.md, "The map").
from clusterfed.algorithms import (  # noqa: E402,F401,I001
    cfl,
    fedavg,
    fedavg_ft,
    fedem,
    fednova,
    fedprox,
    fedrc,
    fedsoft,
    fesem,
    flexcfl,
    flhc,
    ifca,
    lcfl,
    lg_fedavg,
    local,
    pacfl,
    per_fedavg,
    scaffold,
)
from clusterfed.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClusterView,
    RoundContext,
    Setup,
    Update,
    build_algorithm,
)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClusterView",
    "RoundContext",
    "Setup",
    "Update",
    "build_algorithm",
]
