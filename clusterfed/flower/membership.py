"""Who may join a Flower run: the hello check, and the federation of the nodes that fit.

The server reads no data. Before round 0 every node describes its data (`ClientNode.describe`:
counts, input shape, classes seen, its privacy secret's id) and the server checks those facts
against the run config. A node that does not fit is refused with a reason and the run goes on
with the others: the federation is the partitions that fit, numbered 0..M-1 in partition order.
That is the federation the in-process simulator builds from those clients' folders, so sampling
and every per-(round, step, client) generator agree with it; a refused client kept under its
number with no weight would instead be planned for, sampled and evaluated by every algorithm.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterfed.data import own
from clusterfed.errors import ClusterfedError, ConfigError

Facts = Mapping[str, Any]


@dataclass(frozen=True)
class Expected:
    """What the run config fixes about the nodes; None: what most nodes describe."""

    clients: int
    input_shape: tuple[int, ...] | None = None
    n_classes: int | None = None
    privacy: bool = False         # run.privacy is on
    privacy_seed: bool = False    # run.privacy_seed is set (a secret the server knows)


def expected_from_config(config: Mapping[str, Any]) -> Expected:
    """The run config's side of the hello check; refuses a config a Flower server cannot run."""
    run = config["run"]
    if run.get("privacy_secret_file"):
        raise ConfigError("run.privacy_secret_file names a file the server would read: under "
                          "Flower the clients' secret is each SuperNode's node config "
                          "privacy-secret-file, and the run config names none")
    data = config["data"]
    shape = n_classes = None
    if data["dataset"] == own.FOLDERS:
        agreement = own.agreement_from_config(data, config["seed"])
        if agreement.n_classes is None or agreement.input_shape is None:
            raise ConfigError(f"a Flower run over own data (data.dataset={own.FOLDERS}) names "
                              "data.n_classes and data.input_shape, the federation's agreement "
                              "(the server reads no data), e.g. data.n_classes=10 "
                              "data.input_shape=[1,28,28]")
        shape, n_classes = agreement.input_shape, agreement.n_classes
    return Expected(int(config["scenario"]["clients"]), shape, n_classes,
                    run["privacy"] != "none", run["privacy_seed"] is not None)


@dataclass(frozen=True)
class Reference:
    """What every member shares: the run config's values, else most nodes' (ties: the lowest
    partition's)."""

    input_shape: tuple[int, ...] | None
    n_classes: int | None
    secret_id: str = ""   # the privacy secret's id ("": the nodes hold none)


def _most(facts: list[Facts], key: str, convert: Callable[[Any], Any]) -> Any:
    values = [convert(f[key]) for f in facts if key in f]
    if not values:
        return None
    counts = Counter(values)
    return max(values, key=lambda v: counts[v])   # the first of the most common


def reference_of(heard: Mapping[int, Facts], expected: Expected) -> Reference:
    valid = [f for p, f in sorted(heard.items())
             if "problem" not in f and 0 <= p < expected.clients]
    shape = expected.input_shape or _most(valid, "input_shape",
                                          lambda s: tuple(int(v) for v in s))
    n_classes = expected.n_classes or _most(valid, "n_classes", int)
    secret = (_most(valid, "privacy_secret_id", str) or "") if expected.privacy else ""
    return Reference(shape, n_classes, secret)


def hello_problem(facts: Facts, expected: Expected, reference: Reference) -> str | None:
    """Why a node's described data does not fit the run (None: it does).

    The checks of `clusterfed.data.own.check_client`, on the facts a node describes.
    """
    if "problem" in facts:
        return str(facts["problem"])
    partition, n = int(facts["partition"]), expected.clients
    if not 0 <= partition < n:
        return f"partition-id={partition} is outside the federation's {n} clients (0..{n - 1})"
    if "num_clients" in facts and int(facts["num_clients"]) != n:
        return f"num-partitions={facts['num_clients']}, the federation has {n} clients"
    shape = [int(s) for s in facts["input_shape"]]
    if reference.input_shape is not None and tuple(shape) != reference.input_shape:
        return f"inputs shaped {shape}, the federation's are {list(reference.input_shape)}"
    if reference.n_classes is not None:
        if "n_classes" in facts and int(facts["n_classes"]) != reference.n_classes:
            return f"{facts['n_classes']} classes, the federation has {reference.n_classes}"
        top = max((int(c) for c in facts.get("classes", [])), default=-1)
        if top >= reference.n_classes:
            return f"label {top} outside the federation's {reference.n_classes} classes"
    if int(facts["num_train"]) <= 0:
        return "no training samples"
    if expected.privacy:
        held = str(facts.get("privacy_secret_id", ""))
        if held != reference.secret_id:
            if not held:
                return "holds no privacy secret file; the federation's nodes do"
            if not reference.secret_id:
                return "holds a privacy secret file; the federation's nodes do not"
            return "holds another privacy secret than the federation's nodes"
    return None


@dataclass(frozen=True)
class Admission:
    """The run's federation: member partitions in client order, and the refused ones."""

    members: tuple[int, ...]
    refused: dict[int, str] = field(default_factory=dict)
    reference: Reference = Reference(None, None)


def admit(heard: Mapping[int, Facts], expected: Expected) -> Admission:
    """Decide, from every partition's hello, who is in the federation."""
    reference = reference_of(heard, expected)
    if expected.privacy and expected.privacy_seed and reference.secret_id:
        raise ClusterfedError("run.privacy_seed is set, but the nodes hold privacy secret "
                              "files: a seed in the run config is known to the server and is "
                              "no secret; drop run.privacy_seed")
    problems = {p: hello_problem(f, expected, reference) for p, f in sorted(heard.items())}
    return Admission(tuple(p for p, why in problems.items() if why is None),
                     {p: why for p, why in problems.items() if why is not None}, reference)
