"""The reproduction pages' tables, generated from the committed run records.

`python -m clusterfed.experiments.pages` rewrites every block between `<!-- generated: NAME -->`
and `<!-- end generated -->` in docs/reproductions/*.md from the tables declared in pages.yaml:
the paper's figure (from the preset), ours as mean +- std over the recorded seeds under both
protocols, the scale, the table's one protocol and the verdict by the rule of
docs/reproductions/README.md. `--check` writes nothing and exits 1 when a page differs.
No torch: the records are JSON and YAML.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from clusterfed import config as cfg
from clusterfed.errors import ConfigError
from clusterfed.experiments.records import Figure, figures, mean_std, paper_figure, verdict

DECLARATIONS = Path(__file__).with_name("pages.yaml")
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)"
                   r"(<!-- end generated -->)", re.DOTALL)

EVAL_PROTOCOLS = {"local": "each client's own model after its local training",
                  "cluster": "each client's cluster model",
                  "mixture": "each client's mixture of the component models"}


def summaries_of(runs_dir: Path, folders: Sequence[str]) -> list[tuple[int, dict[str, float]]]:
    """(seed, figures) of the runs in the named folders (a sweep's points), seed-ordered."""
    found = [json.loads((runs_dir / f / "summary.json").read_text()) for f in folders]
    return sorted(((int(s["seed"]), figures(s)) for s in found), key=lambda run: run[0])


def seed_runs(folder: Path, label: str) -> list[tuple[int, dict[str, float]]]:
    """(seed, figures) of each recorded run of `label`: its summary.json files, else the
    per-seed figures of the folder's reproduce.json."""
    summaries = sorted((folder / label).glob("seed-*/summary.json"),
                       key=lambda p: int(p.parent.name.removeprefix("seed-")))
    if summaries:
        return [(int(p.parent.name.removeprefix("seed-")), figures(json.loads(p.read_text())))
                for p in summaries]
    table = folder / "reproduce.json"
    if not table.exists():
        return []
    result = json.loads(table.read_text())
    for row in result["rows"]:
        if row["label"] == label:
            return list(zip(row.get("seeds", result["seeds"]), row["runs"], strict=True))
    return []


def row_protocol(folder: Path, label: str) -> str | None:
    """The eval.protocol a label's runs ran, where the records say (a compare entry may set
    its own)."""
    for path in sorted((folder / label).glob("seed-*/config.yaml")):
        return str(yaml.safe_load(path.read_text())["eval"]["protocol"])
    if (folder / "reproduce.json").exists():
        result = json.loads((folder / "reproduce.json").read_text())
        for row in result["rows"]:
            if row["label"] == label:
                return str(row.get("eval_protocol", result["eval_protocol"]))
    return None


def recorded_config(folder: Path, runs: Sequence[Path], preset: str | None
                    ) -> tuple[dict[str, Any], str]:
    """The config the records ran and where it was read: a run's config.yaml (`runs`: the
    run folders, in the rows' order), else the folder's, else (no config recorded) the
    preset as it is now."""
    for run in runs:
        if (run / "config.yaml").exists():
            return dict(yaml.safe_load((run / "config.yaml").read_text())), "Recorded"
    if (folder / "config.yaml").exists():
        return dict(yaml.safe_load((folder / "config.yaml").read_text())), "Recorded"
    if preset is None:
        raise ConfigError(f"{folder}: no config.yaml recorded and no preset declared")
    return cfg.resolve(preset), "The records hold no config; the preset now"


def scale_of(config: Mapping[str, Any]) -> str:
    """A config's scale in one line."""
    s, t = config["scenario"], config["train"]
    share = t["participation"]   # a fraction of the clients, or a count above 1
    sampled = (f"{share} clients" if share > 1 else f"{round(100 * share)} % of the clients")
    return (f"{config['data']['dataset']}, `{s['kind']}`, {s['clients']} clients, "
            f"{t['rounds']} rounds of {t['local_epochs']} local epochs, {sampled} a round, "
            f"batch {t['batch_size']}, lr {t['lr']}, momentum {t['momentum']}, "
            f"`eval.protocol: {config['eval']['protocol']}` every {config['eval']['every']} "
            f"rounds")


def _pm(pair: Figure, digits: int = 2) -> str:
    return "-" if pair[0] != pair[0] else f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def _figure(values: Sequence[float], digits: int = 2, each: bool = True) -> str:
    """Mean +- std over the seeds, then each seed's figure; one seed's figure alone."""
    if len(values) == 1:
        return _each(values, digits)
    shown = _pm(mean_std(values), digits)
    return f"{shown} ({_each(values, digits)})" if each and shown != "-" else shown


def _each(values: Sequence[float], digits: int = 2) -> str:
    return ", ".join("-" if v != v else f"{v:.{digits}f}" for v in values)


def table(name: str, spec: Mapping[str, Any], paper: Mapping[str, Figure], runs_dir: Path) -> str:
    """One generated block's text."""
    folder = runs_dir / spec["runs"]
    protocol = spec["protocol"]
    rows = spec["rows"]
    others = "".join(f", [`runs/{f}/`](runs/{f}/)" for f in
                     dict.fromkeys(r["runs"] for r in rows.values() if "runs" in r))
    run_folders = [runs_dir / f for r in rows.values() for f in r.get("summaries", [])]
    for label in rows:
        run_folders += sorted((folder / label).glob("seed-*"))
    recorded, source = recorded_config(folder, run_folders, spec.get("preset"))
    run_protocol = recorded["eval"]["protocol"]
    lines = [f"Paper: {spec['caption']}", "",
             f"Protocol of every verdict: {spec['protocol_text']}. Both of our figures are "
             f"shown in every row: `{run_protocol}` is the run's `eval.protocol` "
             f"({EVAL_PROTOCOLS.get(run_protocol, run_protocol)}), `served` the model the "
             f"server serves the client (its cluster's; FedAvg's "
             f"global one), '-' where the run did not score it; a protocol after a name is "
             f"that row's own (its compare entry's `eval`).", "",
             f"Scale: {spec['scale']}. {source}: {scale_of(recorded)}.", "",
             f"Records: [`runs/{spec['runs']}/`](runs/{spec['runs']}/){others}. Verdict: "
             f"the rule of [README](README.md#verdict-rule). Generated by `python -m "
             f"clusterfed.experiments.pages` (table `{name}`); per-seed figures in brackets.",
             "",
             f"| algorithm | paper | ours, `{run_protocol}` | ours, served "
             f"| seeds | clusters |{' ARI |' if spec.get('ari') else ''}"
             f"{' shares error |' if spec.get('shares') else ''} verdict |",
             "| --- | ---: | ---: | ---: | --- | --- |"
             + " ---: |" * (bool(spec.get("ari")) + bool(spec.get("shares"))) + " --- |"]
    for key, row in rows.items():
        # A row may read another folder's runs (an earlier variant kept apart) of its `label`.
        label = row.get("label", key)
        measured = (summaries_of(runs_dir, row["summaries"]) if "summaries" in row
                    else seed_runs(runs_dir / row.get("runs", spec["runs"]), label))
        seeds = [s for s, _ in measured]
        own = [f["own"] for _, f in measured]
        served = [f["cluster"] for _, f in measured]
        ours = {"own": mean_std(own), "cluster": mean_std(served)}
        if label not in paper:
            judged, shown = "no paper figure", ""
        else:
            # A mean alone (the paper gave no std) is shown alone.
            shown = _pm(paper[label]) if paper[label][1] else f"{paper[label][0]:.2f}"
            judged = (f"not comparable: {row['not_comparable']}" if "not_comparable" in row
                      else verdict(paper[label], ours[protocol], len(seeds)))
        clusters = _each([f["clusters"] for _, f in measured], 0)
        extra = "".join(f" {_figure([f.get(key, math.nan) for _, f in measured], 3, False)} |"
                        for key, column in (("ari", "ari"), ("shares_error", "shares"))
                        if spec.get(column))
        own_protocol = (row_protocol(runs_dir / row.get("runs", spec["runs"]), label)
                        if "summaries" not in row else None)
        name = row["name"] + (f" (`{own_protocol}`)" if own_protocol not in (None, run_protocol)
                              else "")
        lines.append(f"| {name} | {shown} | {_figure(own)} | {_figure(served)} | "
                     f"{', '.join(map(str, seeds)) or 'none'} | {clusters} |{extra} {judged} |")
    return "\n".join(lines) + "\n"


def preset_reproduce(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The `reproduce` section of the table's preset (empty without one)."""
    if "preset" not in spec:
        return {}
    return dict(cfg.load_source(spec["preset"])[1].get("reproduce", {}) or {})


def paper_of(spec: Mapping[str, Any]) -> dict[str, Figure]:
    """The table's paper figures: its preset's `reproduce.paper`, then its own `paper`."""
    declared: dict[str, Any] = dict(preset_reproduce(spec).get("paper", {}))
    declared.update(spec.get("paper", {}))
    return {label: paper_figure(label, figure) for label, figure in declared.items()}


def declared(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The table as declared, its preset's declarations joined: the protocol must be the
    preset's `reproduce.protocol` (one a table, declared before the runs), and a row the
    preset calls `not_comparable` is so here unless the row says otherwise."""
    section = preset_reproduce(spec)
    if "preset" in spec and spec["protocol"] != section.get("protocol", "own"):
        raise ConfigError(f"table {name}: protocol {spec['protocol']!r} differs from preset "
                          f"{spec['preset']}'s reproduce.protocol "
                          f"{section.get('protocol', 'own')!r}")
    reasons = dict(section.get("not_comparable", {}) or {})
    rows = {key: ({**row, "not_comparable": reasons[row.get("label", key)]}
                  if row.get("label", key) in reasons and "not_comparable" not in row else row)
            for key, row in spec["rows"].items()}
    return {**spec, "rows": rows}


def generate(docs: Path, declarations: Path = DECLARATIONS) -> dict[Path, str]:
    """Every page with generated blocks -> its text with the blocks regenerated."""
    tables = yaml.safe_load(declarations.read_text())["tables"]
    pages: dict[Path, str] = {}
    for name, spec in tables.items():
        page = docs / spec["page"]
        text = pages.get(page) or page.read_text()
        block = table(name, declared(name, spec), paper_of(spec), docs / "runs")
        found = False

        def fill(match: re.Match[str], name: str = name, block: str = block) -> str:
            nonlocal found
            if match["name"] != name:
                return match[0]
            found = True
            return match[1] + block + match[4]

        text = BLOCK.sub(fill, text)
        if not found:
            raise ConfigError(f"{page} has no block <!-- generated: {name} --> for table {name}")
        pages[page] = text
    for page in sorted(docs.glob("*.md")):   # a block whose declaration is gone
        for match in BLOCK.finditer(page.read_text()):
            if match["name"] not in tables:
                raise ConfigError(f"{page} has a block <!-- generated: {match['name']} --> "
                                  f"that {declarations.name} does not declare")
    return pages


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusterfed.experiments.pages",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--docs", default="docs/reproductions", type=Path)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page's tables differ from the records")
    args = parser.parse_args(argv)
    try:
        pages = generate(args.docs)
    except (ConfigError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stale = [page for page, text in pages.items() if page.read_text() != text]
    for page in stale:
        if not args.check:
            page.write_text(pages[page])
        print(f"{page}: {'differs from' if args.check else 'regenerated from'} the records")
    return 1 if args.check and stale else 0

if __name__ == "__main__":
    sys.exit(main())
