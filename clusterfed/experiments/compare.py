"""`compare`: one configuration, several algorithms, one table (`report/tables.py`).

Rerunning a comparison into the same folder reads its finished runs back and resumes a cut-off
one from its checkpoint (a folder holding another config is refused); remove the folder to
start over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed import strict_json
from clusterfed.algorithms import ALGORITHMS
from clusterfed.errors import ConfigError


def algorithm_sections(config: Mapping[str, Any], names: Sequence[str] | None
                       ) -> list[dict[str, Any]]:
    """The algorithm sections to compare: explicit names, else the config's list, else all.

    A list entry is a name or a mapping {name: ..., option: ...} with that algorithm's options;
    an optional `label` names the run (one algorithm under several options, e.g. LCFL's metric
    ablations) and is what `names` and the table use; an optional `eval` mapping overrides the
    config's eval keys for that run alone (`run_config_of`).
    """
    listed = list(config["compare"]["algorithms"])
    own_options = {e.get("label", e["name"]): e for e in listed if isinstance(e, Mapping)}
    # A name asked for on the command line keeps the options the config gives it.
    entries: list[Any] = [own_options.get(n, n) for n in names] if names else listed
    if not entries:
        entries = ALGORITHMS.names()
    sections = []
    for entry in entries:
        section = {"name": entry} if isinstance(entry, str) else dict(entry)
        ALGORITHMS.get(str(section.get("name")))
        sections.append(section)
    return sections


def labelled_sections(config: Mapping[str, Any], names: Sequence[str] | None
                      ) -> list[tuple[str, dict[str, Any]]]:
    """(label, algorithm section without its label) of each entry of `algorithm_sections`."""
    return [(str(s.pop("label", s["name"])), s) for s in algorithm_sections(config, names)]


# Sections a compare entry may override for its run alone.
ENTRY_SECTIONS = ("eval", "newcomers", "train")


def run_config_of(config: Mapping[str, Any], section: Mapping[str, Any]) -> dict[str, Any]:
    """The config of one entry's run: `config` with the entry's algorithm section and, where
    the entry has an `eval`, a `newcomers` or a `train` mapping, those keys over the config's.
    So a comparison tests each method by its own paper's protocol (`eval: {protocol: mixture}`
    on FedEM beside methods that serve one model a client; `newcomers: {finetune_rounds: 5}`
    on the SOLO of PACFL's Table 3) and its own paper's optimiser (`train: {lr: 0.1,
    momentum: 0.9}`: PACFL's Table 12 baselines); the entry's run folder records what it
    used."""
    algorithm = dict(section)
    # A list under `newcomers` is PACFL's and CFL's own option (the late clients' ids); no
    # algorithm has an option called `eval` or `train`.
    own = {name: algorithm.pop(name) for name in ENTRY_SECTIONS if name in algorithm
           and (name != "newcomers" or isinstance(algorithm[name], Mapping))}
    for name, keys in own.items():
        if not isinstance(keys, Mapping):
            raise ConfigError(f"compare entry {algorithm.get('name')!r}: {name} must be a "
                              f"mapping of {name} keys, got {keys!r}")
    run_cfg = cfg.merge(dict(config), {"algorithm": algorithm,
                                       **{name: dict(keys) for name, keys in own.items()}})
    cfg.validate(run_cfg)
    return run_cfg


def compare(config: Mapping[str, Any], out_dir: str | Path, names: Sequence[str] | None = None,
            *, data_dir: str | None = None, jobs: int = 1) -> dict[str, Any]:
    """Run each algorithm on the same federation; write comparison.json. `jobs`: runs at a
    time, each in its own process (`run_jobs`)."""
    # Here, not at the top: the report reads comparisons without importing the simulator.
    from clusterfed.experiments.resumable import IDENTITY_WITH_EVAL, Job, run_jobs, threads_per_job

    out = Path(out_dir)
    labelled = labelled_sections(config, names)
    labels = [label for label, _ in labelled]
    sections = [section for _, section in labelled]
    if len(set(labels)) != len(labels):
        raise ConfigError("compare lists an algorithm twice; give each run a distinct name "
                          "or label")
    run_cfgs = [run_config_of(config, s) for s in sections]   # every entry checked first
    done = run_jobs([Job(threads_per_job(run_cfg, jobs), out / label, IDENTITY_WITH_EVAL)
                     for label, run_cfg in zip(labels, run_cfgs, strict=True)],
                    data_dir, workers=jobs)
    summaries = dict(zip(labels, done, strict=True))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(cfg.dump(config))
    comparison = {"algorithms": labels, "summaries": summaries}
    (out / "comparison.json").write_text(strict_json.dumps(comparison, indent=2) + "\n")
    return comparison
