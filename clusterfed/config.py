"""Run configuration: defaults, presets, YAML files and dotted `key=value` overrides."""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from clusterfed.errors import ConfigError
from clusterfed.tasks import SPLITS


class _ConfigLoader(yaml.SafeLoader):
    """YAML 1.1 (PyYAML's) reads `1e-3` or JSON's `1e-08`, with no dot, as a string; a config
    reads them as numbers, as YAML 1.2 and JSON do."""


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """YAML (or JSON) text as a config reads it: safe, with exponent numbers as floats."""
    return yaml.load(text, Loader=_ConfigLoader)   # a SafeLoader: no arbitrary objects

DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "data": {"dataset": "digits", "root": None},
    "scenario": {"kind": "iid", "clients": 10, "clusters": 1},
    "model": {"name": "digits_cnn"},
    "train": {
        "rounds": 10,
        "participation": 1.0,   # a fraction in (0, 1], or a count of clients > 1
        "local_epochs": 1,
        "local_steps": None,    # set this and local_epochs=null to train K steps
        "batch_size": 10,
        "lr": 0.05,
        "lr_decay": 1.0,        # lr in round r (0-based) is lr * lr_decay ** r
        "momentum": 0.0,
        "weight_decay": 0.0,
        "clip_grad_norm": None,  # clip each local step's gradient to this L2 norm
        "optimizer": "sgd",     # or "adam"
        "optimizer_state": "fresh",  # or "kept": a client's optimiser state lasts the run
        "adam_betas": [0.9, 0.999],
        "adam_eps": 1e-8,
    },
    "algorithm": {"name": "fedavg"},
    "eval": {
        # "cluster": the client's cluster model; "local": its own last trained model; also
        # "best_of_path", "sampled_local" (LCFL's authors), "min_test_loss" (IFCA's), "mixture":
        # docs/configuration.md
        "protocol": "cluster",
        "every": 1,             # evaluate every N rounds (and always after the last)
        "validation_fraction": 0.0,  # share of each client's training data held out
        "split": "test",        # the data every figure is scored on: "test" or "validation"
        "also_cluster": False,  # protocol local: also score cluster models (cluster_* keys)
        "target_accuracy": None,  # also record the share of clients at or above this accuracy
    },
    "run": {
        "checkpoint_every": 5,
        "progress": True,
        "threads": None,        # torch threads here; None: 1 for small models (sim/choice.py)
        "privacy": "none",      # or "permutation" / "signed_permutation" (CFL Section V-B)
        "privacy_seed": None,   # the clients' shared secret (default: derived from the seed)
        "privacy_secret_file": None,  # or a file of the clients' secret (clusterfed secret new)
        "device": "auto",       # "auto" (CUDA when available, else cpu), "cpu", "cuda", "cuda:1"
        "executor": "auto",     # "auto" (see sim/choice.py), "sequential", "vectorised" (many
                                # clients at once with torch.func.vmap), "grouped" (a round's
                                # clients as one wider model, for CPUs), "processes" (one
                                # single-threaded worker process per core)
        "workers": None,        # processes: worker count (default: run.threads, else the cores);
                                # grouped: 2 or more runs it in that many workers
        "loggers": [],          # experiment trackers beside the run folder: tensorboard,
                                # mlflow, wandb (each its own extra; docs/trackers.md)
        "experiment": None,     # the trackers' experiment name (compare/sweep/reproduce/
                                # benchmark: their folder's name); default "clusterfed"
    },
    # Late clients for any algorithm (algorithms/newcomers.py): out of the federation until
    # round join_round (0-based), when each receives a model and fine-tunes it locally once.
    "newcomers": {"clients": [], "join_round": None, "finetune": True, "finetune_rounds": 1,
                  "join": "least_loss"},
    "compare": {"algorithms": []},
    # `clusterfed sweep`: dotted keys -> value lists (see clusterfed/experiments/sweep.py).
    "sweep": {},
    # `clusterfed reproduce`: seeds, algorithms and the paper's figures (experiments/reproduce.py).
    "reproduce": {},
}

# Sections whose keys are fixed here; the others also take their kind's own keys.
CLOSED_SECTIONS = {"train", "eval", "run", "compare", "newcomers"}
# Changing one of these keys drops the base config's other keys of that section.
KIND_KEYS = {"data": "dataset", "scenario": "kind", "model": "name", "algorithm": "name"}
# "sampled_local": LCFL's authors' figure (sim/protocols.py, `SampledLocal`); "mixture":
# FedEM's and FedRC's prediction, each client's mixture of the models (`Mixture`).
EVAL_PROTOCOLS = ("cluster", "local", "best_of_path", "sampled_local", "min_test_loss",
                  "mixture")
# Keys that keep their meaning when the section's kind changes.
KIND_INDEPENDENT = {
    "scenario": {"clients", "clusters", "samples_per_client", "test_samples_per_client", "test",
                 "quantity_skew", "clients_per_cluster", "drift", "corruption",
                 "label_noise"},
    "data": {"root", "download"},
}


def presets_dir() -> Path:
    """The presets of no single method (comparisons, quick starts)."""
    return Path(str(resources.files("clusterfed.experiments") / "presets"))


def preset_paths() -> dict[str, Path]:
    """Every preset, name -> file: `presets_dir()`, each method folder's `presets/`, and those
    of methods registered from elsewhere."""
    builtin = Path(str(resources.files("clusterfed") / "algorithms"))
    # The folders are listed, not imported: the methods' modules take a second to load, and
    # a mistyped preset name should be answered at once.
    folders = [presets_dir(), *sorted(builtin.glob("*/presets"))]
    base = sys.modules.get("clusterfed.algorithms.base")
    if base is not None:
        registry = base.ALGORITHMS
        for name in registry.names():
            package = registry.method(name).package
            if package:
                folders.append(Path(str(resources.files(package) / "presets")))
    found: dict[str, Path] = {}
    for folder in dict.fromkeys(folders):   # methods sharing a folder list it once
        for path in sorted(folder.glob("*.yaml")):
            if path.stem in found and found[path.stem] != path:
                raise ConfigError(f"preset {path.stem!r} is defined twice: {found[path.stem]} "
                                  f"and {path}")
            found[path.stem] = path
    return found


def preset_names() -> list[str]:
    return sorted(preset_paths())


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = load_yaml(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {yaml_problem(err)}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping of config sections")
    return loaded


def yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's error in one line: where, and what (its own text spans several lines)."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(getattr(err, "problem", None) or err).split())


def load_source(source: str) -> tuple[str, dict[str, Any]]:
    """A preset name or a YAML file path -> (name, its raw content)."""
    path = Path(source)
    if source.endswith((".yaml", ".yml")) or path.is_file():
        if not path.is_file():
            raise ConfigError(f"config file {source} does not exist")
        return path.stem, _read_yaml(path)
    presets = preset_paths()
    if source not in presets:
        raise ConfigError(f"unknown preset {source!r}; valid presets: {', '.join(sorted(presets))}")
    return source, _read_yaml(presets[source])


def merge(base: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Apply a nested patch section by section; a kind change drops the old kind's keys."""
    out = copy.deepcopy(base)
    for section, value in patch.items():
        if section not in DEFAULTS:
            raise ConfigError(
                f"unknown config section {section!r}; valid sections: {', '.join(DEFAULTS)}"
            )
        if not isinstance(DEFAULTS[section], dict):
            out[section] = value
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(f"config section {section!r} must be a mapping")
        if section in CLOSED_SECTIONS:
            for key in value:
                if key not in DEFAULTS[section]:
                    raise ConfigError(
                        f"unknown config key {section}.{key} in section '{section}'; "
                        f"valid keys: {', '.join(DEFAULTS[section])}"
                    )
        merged = dict(out.get(section, {}))
        kind = KIND_KEYS.get(section)
        if kind in value and value[kind] != merged.get(kind):
            common = DEFAULTS[section].keys() | KIND_INDEPENDENT.get(section, set())
            merged = {k: v for k, v in merged.items() if k in common}
        for key, item in value.items():
            merged[key] = _patched(merged.get(key), item, f"{section}.{key}")
        out[section] = merged
    return out


class _Dotted(dict):
    """Keys that a dotted override sets below a section's key: merged into what is there,
    where any other mapping in a patch replaces the value it patches."""


def _patched(base: Any, patch: Any, path: str) -> Any:
    """`patch` over `base` at `path`; a dotted patch that changes a mapping's `kind` drops the
    old kind's keys, as a section's kind change does."""
    if not isinstance(patch, _Dotted):
        return _plain(patch)
    if base is None:
        base = {}
    if not isinstance(base, Mapping):
        raise ConfigError(f"cannot set {path}.{next(iter(patch))}: {path} is {base!r}, "
                          f"not a mapping")
    out = {} if "kind" in patch and patch["kind"] != base.get("kind") else dict(base)
    for key, value in patch.items():
        out[key] = _patched(out.get(key), value, f"{path}.{key}")
    return out


def _plain(value: Any) -> Any:
    """Plain dicts all the way down, so a resolved config dumps as YAML."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """['train.lr=0.1', 'seed=3'] -> {'train': {'lr': 0.1}, 'seed': 3}; values are YAML.

    A key below a section's key (`scenario.labels.kind=dirichlet`) sets that one entry and
    keeps the mapping's others."""
    patch: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            value = load_yaml(raw) if raw else None
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: cannot parse the value "
                              f"({yaml_problem(err)})") from None
        parts = key.split(".")
        if not all(parts):
            raise ConfigError(f"override key {key!r} has an empty part; use section.key.subkey")
        if parts[0] not in DEFAULTS:
            raise ConfigError(
                f"unknown config section {parts[0]!r} in override {item!r}; "
                f"valid sections: {', '.join(DEFAULTS)}"
            )
        if len(parts) == 1:
            if isinstance(DEFAULTS[parts[0]], dict):
                raise ConfigError(f"override {item!r} names a section; use {parts[0]}.KEY=VALUE")
            patch[parts[0]] = value
        else:
            if not isinstance(DEFAULTS[parts[0]], dict):
                raise ConfigError(f"{parts[0]} is a value, not a section: use {parts[0]}=VALUE")
            set_dotted(patch, parts, value, f"override {item!r}")
    return patch


def set_dotted(patch: dict[str, Any], parts: list[str], value: Any, item: str) -> None:
    """Set patch[section][a]...[z] = value for parts [section, a, ..., z], making dotted levels
    on the way; `item` names the key in an error."""
    node = patch.setdefault(parts[0], {})
    for depth, part in enumerate(parts[1:-1], start=1):
        if part not in node or node[part] is None:
            node[part] = _Dotted()
        elif not isinstance(node[part], dict):
            raise ConfigError(f"{item}: an earlier key set {'.'.join(parts[:depth + 1])} to "
                              f"{node[part]!r}, not a mapping")
        node = node[part]
    node[parts[-1]] = value


def resolve(source: str | Mapping[str, Any], overrides: Iterable[str] = ()) -> dict[str, Any]:
    """Defaults <- preset or file (or a mapping) <- overrides, then validated."""
    raw = load_source(source)[1] if isinstance(source, str) else dict(source)
    config = merge(merge(DEFAULTS, raw), parse_overrides(overrides))
    validate(config)
    return config


def validate(config: Mapping[str, Any]) -> None:
    """Checks that need no data or registry: types and ranges of the closed sections."""
    if not isinstance(config["seed"], int):
        raise ConfigError(f"seed must be an integer, got {config['seed']!r}")
    train = config["train"]
    for key in ("rounds", "batch_size"):
        if not isinstance(train[key], int) or train[key] < 1:
            raise ConfigError(f"train.{key} must be a positive integer, got {train[key]!r}")
    for key in ("lr", "lr_decay", "momentum", "weight_decay", "adam_eps", "clip_grad_norm"):
        value = train[key]
        if not (value is None and key == "clip_grad_norm") and (
                isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"train.{key} must be a number, got {value!r}")
    participation = train["participation"]
    if not isinstance(participation, int | float) or isinstance(participation, bool) \
            or participation <= 0:
        raise ConfigError(
            f"train.participation must be a fraction in (0, 1] or a client count, got "
            f"{participation!r}: with no participating clients nothing is trained"
        )
    betas = train["adam_betas"]
    if not isinstance(betas, list | tuple) or len(betas) != 2 or not all(
            isinstance(b, int | float) and not isinstance(b, bool) for b in betas):
        raise ConfigError(f"train.adam_betas must be two numbers [beta1, beta2], got {betas!r}")
    if participation > 1 and participation != int(participation):
        raise ConfigError(f"train.participation above 1 is a count and must be whole, "
                          f"got {participation}")
    ev = config["eval"]
    if ev["protocol"] not in EVAL_PROTOCOLS:
        raise ConfigError(f"unknown eval.protocol {ev['protocol']!r}; valid: "
                          f"{', '.join(EVAL_PROTOCOLS)}")
    fraction = ev["validation_fraction"]
    if not isinstance(fraction, int | float) or not 0.0 <= fraction < 1.0:
        raise ConfigError(f"eval.validation_fraction must be in [0, 1), got {fraction!r}")
    if ev["protocol"] == "best_of_path" and not fraction:
        raise ConfigError("eval.protocol=best_of_path chooses models on held-out data: "
                          "set eval.validation_fraction, e.g. 0.2")
    if ev["split"] not in SPLITS:
        raise ConfigError(f"eval.split must be one of {', '.join(SPLITS)}, got {ev['split']!r}")
    if ev["split"] == "validation" and not fraction:
        raise ConfigError("eval.split=validation scores on held-out training data: set "
                          "eval.validation_fraction, e.g. 0.1")
    if ev["split"] == "validation" and ev["protocol"] == "best_of_path":
        raise ConfigError("eval.protocol=best_of_path already chooses on the validation data "
                          "and reports test figures; use eval.split=test with it")
    if ev["split"] == "validation" and ev["protocol"] == "sampled_local":
        # Its mean is weighted by the clients' test sizes.
        raise ConfigError("eval.protocol=sampled_local weighs clients by their test data; "
                          "use eval.split=test with it")
    if not isinstance(ev["also_cluster"], bool):
        raise ConfigError(f"eval.also_cluster must be true or false, got {ev['also_cluster']!r}")
    target = ev["target_accuracy"]
    if target is not None and (isinstance(target, bool) or not isinstance(target, int | float)
                               or not 0.0 < target <= 1.0):
        raise ConfigError(f"eval.target_accuracy must be a fraction in (0, 1] or null, "
                          f"got {target!r}")
    if not isinstance(ev["every"], int) or ev["every"] < 1:
        raise ConfigError(f"eval.every must be a positive integer, got {ev['every']!r}")
    if config["run"]["executor"] not in ("auto", "sequential", "vectorised", "grouped",
                                         "processes"):
        raise ConfigError(f"unknown run.executor {config['run']['executor']!r}; valid: auto, "
                          "sequential, vectorised, grouped, processes")
    threads = config["run"]["threads"]
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ConfigError(f"run.threads must be a positive integer or null (torch's default), "
                          f"got {threads!r}")
    workers = config["run"]["workers"]
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ConfigError(f"run.workers must be a positive integer or null, got {workers!r}")
    if not isinstance(config["run"]["device"], str):
        raise ConfigError(f"run.device must be a string such as auto, cpu or cuda, got "
                          f"{config['run']['device']!r}")
    secret_file = config["run"]["privacy_secret_file"]
    if secret_file is not None and not isinstance(secret_file, str):
        raise ConfigError(f"run.privacy_secret_file must be a path, got {secret_file!r}")
    every = config["run"]["checkpoint_every"]
    if not isinstance(every, int) or every < 0:
        raise ConfigError(f"run.checkpoint_every must be an integer >= 0 (0: never), got {every!r}")
    _check_loggers(config["run"])
    _check_newcomers(config["newcomers"])


TRACKERS = ("tensorboard", "mlflow", "wandb")


def _check_loggers(run: Mapping[str, Any]) -> None:
    loggers = run["loggers"]
    if not isinstance(loggers, list | tuple) or not all(isinstance(x, str) for x in loggers):
        raise ConfigError(f"run.loggers must be a list of trackers ({', '.join(TRACKERS)}), "
                          f"got {loggers!r}")
    unknown = [x for x in loggers if x not in TRACKERS]
    if unknown or len(set(loggers)) != len(loggers):
        raise ConfigError(f"run.loggers: {', '.join(unknown) or 'a tracker listed twice'}; "
                          f"valid: {', '.join(TRACKERS)}, each once")
    if run["experiment"] is not None and not isinstance(run["experiment"], str):
        raise ConfigError(f"run.experiment must be a name, got {run['experiment']!r}")


def _check_newcomers(section: Mapping[str, Any]) -> None:
    """Types of the config's `newcomers` section (its ids are checked against the federation
    when the run starts, its `join` rule when the algorithm is built: `build_algorithm`)."""
    clients = section["clients"]
    if not isinstance(clients, list | tuple) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in clients):
        raise ConfigError(f"newcomers.clients must be a list of client ids, got {clients!r}")
    if len(set(clients)) != len(clients):
        raise ConfigError("newcomers.clients lists a client twice")
    join_round = section["join_round"]
    if clients and (not isinstance(join_round, int) or isinstance(join_round, bool)
                    or join_round < 1):
        raise ConfigError(f"newcomers.join_round must be a round >= 1 (0-based) when there are "
                          f"newcomers, got {join_round!r}")
    if not isinstance(section["finetune"], bool):
        raise ConfigError(f"newcomers.finetune must be true or false, "
                          f"got {section['finetune']!r}")
    rounds = section["finetune_rounds"]
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ConfigError(f"newcomers.finetune_rounds must be a whole number >= 1, "
                          f"got {rounds!r}")


def dump(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=False)
