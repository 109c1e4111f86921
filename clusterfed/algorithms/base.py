"""The algorithm interface: init / plan / update over an explicit, serialisable state."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from clusterfed.algorithms.options import options_for
from clusterfed.errors import ConfigError
from clusterfed.registry import Registry, accepted_keys, check_keys
from clusterfed.tasks import ClientResult, ClientTask, TrainSpec

S = TypeVar("S")


@dataclass(frozen=True)
class Setup:
    """What the server knows before round 0: no client data, only counts and the initial model."""

    num_clients: int
    initial_params: np.ndarray  # flat float32
    num_samples: np.ndarray     # training samples per client
    seed: int
    # The flat vector's layout, (name, shape) per parameter tensor in order, for methods that
    # treat layers differently (LG-FedAvg); None where the runtime hides it (run.privacy).
    layout: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    # Another initialisation of the same model by its own init scheme: draw i -> flat float32,
    # a function of (seed, i), in the same parameter space as `initial_params` (draw 0 is
    # `initial_params`). For methods that start several models apart (IFCA); None where the
    # runtime cannot draw.
    draw_initial: Callable[[int], np.ndarray] | None = field(default=None, compare=False,
                                                             repr=False)


@dataclass(frozen=True)
class RoundContext:
    round: int                 # 0-based
    sampled: np.ndarray        # client ids sampled this round, sorted
    train: TrainSpec           # local training settings for this round (lr already decayed)
    step: int = 0              # sub-step within the round, for algorithms with several phases


@dataclass(frozen=True)
class Update:
    state: Any
    metrics: Mapping[str, float] = field(default_factory=dict)
    events: Sequence[Mapping[str, Any]] = ()
    round_done: bool = True    # False: plan again within the same round (step + 1)
    # Arrays for the runtime to score against the true clusters, which algorithms never see:
    # {cluster label: {"similarity": (m, m), "members": (m,) client ids}} -> separation gap.
    diagnostics: Mapping[str, Mapping[str, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterView:
    """Which model serves which client: `models[assignment[c]]` is client c's model.

    `weights`, for methods whose clients predict with a mixture of the models (FedEM, FedRC):
    (num_clients, K), row c client c's mixture weights (>= 0, summing to 1), which the
    evaluation protocol 'mixture' tests; None for methods that serve one model a client.
    """

    models: np.ndarray       # (K, d) float32
    assignment: np.ndarray   # (num_clients,) int, index into models
    weights: np.ndarray | None = None   # (num_clients, K) mixture weights, or None

    @property
    def num_clusters(self) -> int:
        return len(np.unique(self.assignment))


class Algorithm(Protocol[S]):
    """Server logic. Constructors store hyper-parameters only; all else lives in the state.

    A clustered method sets the class attribute `toy_mixture_options` to the options with which
    it claims to recover the true clusters of the contract suite's toy mixture (digits with
    label swap, 4 clusters); the suite then checks that claim.

    Optional: `adaptation(state, train) -> TrainSpec | None`. Given the round's TrainSpec, it
    returns the local training each client does on its served model before it is tested
    (test-time fine-tuning: FedAvg-FT, Per-FedAvg's one-step personalisation). The runtime runs
    it as a TRAIN task at evaluation only, under the protocols 'cluster' and 'local' alike
    (the adapted served model replaces the client's own model); the state never sees it.

    Optional: `soft_assignment(state) -> (num_clients, K) array`, a soft method's weights of
    each client on the view's models where they are not mixture weights (FedSoft's importance
    u): a run scores them against a mixture scenario's true shares (`clustering.shares_error`).

    A clustered method also sets `sees`: the kinds of heterogeneity its clustering signal can
    tell apart, among "concept" (the same inputs labelled differently: label swap,
    permutation), "feature" (other inputs for the same labels: rotation) and "label" (other
    label sets). `clusterfed benchmark` holds it to recovering those, and one cluster on iid.
    """

    toy_mixture_options: ClassVar[Mapping[str, Any] | None]
    sees: ClassVar[frozenset[str]]

    def init(self, setup: Setup) -> S: ...

    def plan(self, state: S, ctx: RoundContext) -> list[ClientTask]: ...

    def update(self, state: S, ctx: RoundContext, results: Sequence[ClientResult]) -> Update: ...

    def clusters(self, state: S) -> ClusterView: ...


@dataclass(frozen=True)
class Method:
    """A registered method's place: its folder and the report section it adds.

    `package` is the folder (as a package) of the module that registered the class: its
    `presets/*.yaml` are presets (`config.preset_paths`). `report` names the module of its
    report section relative to that package (".report"), imported only when a report is
    written, so importing an algorithm loads neither matplotlib nor torch. The module defines
    `run_section(folder, summary, metrics) -> lines` and optionally
    `comparison_section(folder, runs) -> lines` (runs: label -> metrics records), called for
    a comparison that has a run labelled with the method's name.
    """

    name: str
    package: str
    report: str | None = None


class MethodRegistry(Registry[type]):
    """The algorithm registry: name -> class, and each name's `Method`."""

    def __init__(self) -> None:
        super().__init__("algorithm")
        self._methods: dict[str, Method] = {}

    def register(self, name: str, *, report: str | None = None) -> Callable[[type], type]:
        add = super().register(name)

        def decorate(cls: type) -> type:
            add(cls)
            package = getattr(sys.modules.get(cls.__module__), "__package__", None) or ""
            self._methods[name] = Method(name, package, report)
            return cls

        return decorate

    def method(self, name: str) -> Method:
        self.get(name)   # unknown names: the registry's error
        return self._methods[name]

    def report_module(self, name: str) -> ModuleType | None:
        """The method's report section module, imported now; None if it has none."""
        method = self.method(name)
        if method.report is None:
            return None
        return importlib.import_module(method.report, method.package or None)


ALGORITHMS = MethodRegistry()


def check_choices(options: object, choices: Mapping[str, Sequence[str]]) -> None:
    """Raise ValueError unless each named option of `options` is one of its valid values."""
    for name, valid in choices.items():
        value = getattr(options, name)
        if value not in valid:
            raise ValueError(f"{name} must be one of {', '.join(valid)}, got {value!r}")


def build_algorithm(section: Mapping[str, Any],
                    newcomers: Mapping[str, Any] | None = None) -> Algorithm[Any]:
    """Build an algorithm from the config's `algorithm` section (its name and its own fields)
    and, if it lists clients, the config's `newcomers` section: a method with its own arrival
    rule (`own_newcomers`) takes them as its options, any other is wrapped (`Newcomers`)."""
    from clusterfed.algorithms.newcomers import JOIN_RULES, Newcomers  # it builds on this module

    options = dict(section)
    name = options.pop("name", None)
    cls = ALGORITHMS.get(str(name))
    if newcomers is not None:
        if newcomers.get("join", JOIN_RULES[0]) not in JOIN_RULES:
            raise ConfigError(f"newcomers.join must be one of {', '.join(JOIN_RULES)}, "
                              f"got {newcomers['join']!r}")
    late = list((newcomers or {}).get("clients") or [])
    own = bool(late) and getattr(cls, "own_newcomers", False)
    if own:
        assert newcomers is not None
        if options.get("newcomers"):
            raise ConfigError(f"algorithm {name}: newcomers are set twice, in the newcomers "
                              f"section and as algorithm.newcomers; keep one")
        if newcomers.get("finetune_rounds", 1) != 1:
            raise ConfigError(f"algorithm {name} fine-tunes its newcomers by its own rule: "
                              f"newcomers.finetune_rounds must stay 1")
        options.update(newcomers=late, join_round=newcomers["join_round"])
        if "finetune_newcomers" in (accepted_keys(cls) or ()):
            options["finetune_newcomers"] = newcomers["finetune"]
    try:
        options = options_for(cls, options)
    except ValueError as err:
        raise ConfigError(f"algorithm {name}: {err}") from err
    check_keys("algorithm", options, accepted_keys(cls))
    try:
        algorithm = cls(**options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"algorithm {name}: {err}") from err
    if not late or own:
        return algorithm
    try:
        return Newcomers(algorithm, tuple(int(c) for c in late), int(newcomers["join_round"]),
                         bool(newcomers["finetune"]), str(newcomers["join"]),
                         int(newcomers.get("finetune_rounds", 1)))
    except ValueError as err:
        raise ConfigError(f"newcomers: {err}") from err
