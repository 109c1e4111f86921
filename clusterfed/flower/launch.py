"""`clusterfed flower local`: one experiment on a federation of local processes, start to stop."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clusterfed import config as cfg
from clusterfed.client.secret import read_secret_file
from clusterfed.data import own
from clusterfed.data.scenarios.drift import refuse_drift
from clusterfed.errors import ClusterfedError
from clusterfed.flower.local import LocalFederation, raise_on_sigterm
from clusterfed.flower.wire import config_json
from clusterfed.run_folder import checkpoint_files

# Flower's own lines worth showing without --verbose-flower.
_SHOWN = ("[clusterfed]", "ERROR", "Error", "Traceback", "Exception", "Successfully started run")


def run_config_for(config: Mapping[str, Any], folder: Path, *, resume: bool = False,
                   reply_timeout: float = 600.0, join_timeout: float = 300.0) -> dict[str, Any]:
    """The Flower run config (the app's `[tool.flwr.app.config]` keys) of one experiment."""
    return {"config": config_json(config), "out-dir": str(folder.resolve()), "resume": resume,
            "reply-timeout": float(reply_timeout), "join-timeout": float(join_timeout)}


def own_data_config(config: Mapping[str, Any], root: str | Path) -> dict[str, Any]:
    """The server's config of a run over `root`'s client folders, one per SuperNode:
    data.dataset=folders with the agreement (read here from the folders where the config does
    not name it), no data root, and scenario.clients the number of folders."""
    folders = own.client_folders(root)
    data = ({k: v for k, v in config["data"].items() if k != "root"}
            if config["data"]["dataset"] == own.FOLDERS else {"dataset": own.FOLDERS})
    if data.get("n_classes") is None or data.get("input_shape") is None:
        agreement = own.agreement_from_config(data, config["seed"])
        found = own.federation_from_folders(root, agreement.options,
                                            n_classes=agreement.n_classes,
                                            input_shape=agreement.input_shape)
        data.update(n_classes=found.n_classes, input_shape=list(found.input_shape))
    resolved = cfg.resolve({**config, "data": data,
                            "scenario": {**config["scenario"], "clients": len(folders)}})
    resolved["data"].pop("root", None)
    return resolved


def simulator_note(config: Mapping[str, Any], data_dir: str | None,
                   own_data: str | Path | None = None) -> str | None:
    """Where `clusterfed run` on this config would not give this run's figures digit for digit,
    what it computes with and which settings do; None where it would.

    A Flower node trains one client at a time with one thread, as the simulator's `processes`
    executor and its sequential one at one thread do; grouped and vectorised rounds, and
    several threads, sum in another order (docs/flower.md)."""
    # Imported here: the launcher itself needs no torch.
    from clusterfed.models import FlatModel, build_model
    from clusterfed.sim.build import build_federation_for
    from clusterfed.sim.choice import choose

    if own_data is not None:   # the server's config names no root: the folders are here
        config = {**config, "data": {**config["data"], "root": str(own_data)}}
    federation = build_federation_for(config, data_dir)
    module = build_model(**{"input_shape": federation.input_shape,
                            "n_classes": federation.n_classes, **config["model"]})
    choice = choose(config["run"], FlatModel(module), federation, config["train"])
    if choice.kind == "processes" or (choice.kind == "sequential" and choice.threads == 1):
        return None
    what = choice.describe().removeprefix("executor: ").split(" (auto:")[0]
    return (f"note: `clusterfed run` on this config computes with {what}, so its figures can "
            f"differ from this run's in the last digits; run it with run.executor=processes "
            f"(or run.executor=sequential run.threads=1) for the same figures")


def run_local(config: Mapping[str, Any], folder: str | Path, *, clients: int | None = None,
              data_dir: str | None = None, resume: bool = False, secure: bool = False,
              simulation: bool = False, client_cpus: int = 1, client_gpus: float = 0.0,
              reply_timeout: float = 600.0, join_timeout: float = 300.0,
              own_data: str | Path | None = None, secret_file: str | Path | None = None,
              echo: Callable[[str], None] = print, verbose: bool = False,
              isolation: str = "process") -> dict[str, Any]:
    """Start a SuperLink and the SuperNodes, run the experiment, stop every process.

    `own_data`: a folder of client-K folders; node K serves client-K (no scenario).
    `secret_file`: the privacy secret every node reads; the server's config names none.
    Returns the run's summary; raises ClusterfedError (with the logs' place) when it failed.
    """
    folder = Path(folder).resolve()
    refuse_drift(config, "under Flower")
    if resume and not checkpoint_files(folder):
        raise ClusterfedError(f"{folder} has no checkpoint to resume from")
    # Every local file is checked before a process starts: a node that cannot read it would
    # fail only after the federation is up.
    if config["run"].get("privacy_secret_file"):
        raise ClusterfedError("under Flower the nodes hold the privacy secret: give the file "
                              "with --secret-file, not run.privacy_secret_file")
    if secret_file is not None:
        if config["run"]["privacy"] == "none":
            raise ClusterfedError("--secret-file is the secret of run.privacy: set "
                                  "run.privacy=permutation (or signed_permutation)")
        read_secret_file(secret_file)
    sites = None
    if own_data is not None:
        config = own_data_config(config, own_data)
        sites = [p.resolve() for p in own.client_folders(own_data)]
    try:
        note = simulator_note(config, data_dir, own_data)
    except ClusterfedError:   # the nodes report what is wrong with the data, more precisely
        note = None
    if note:
        echo(note)
    folder.mkdir(parents=True, exist_ok=True)
    n = len(sites) if sites else clients or int(config["scenario"]["clients"])
    summary_path = folder / "summary.json"
    summary_path.unlink(missing_ok=True)
    federation = LocalFederation(n, folder / "flower", secure=secure, simulation=simulation,
                                 data_dir=data_dir, client_cpus=client_cpus,
                                 client_gpus=client_gpus, own_data=sites,
                                 secret_file=Path(secret_file).resolve() if secret_file else None,
                                 isolation=isolation, echo=echo)

    def show(line: str) -> None:
        if verbose or any(tag in line for tag in _SHOWN):
            echo(line)

    undo = raise_on_sigterm()
    try:
        federation.start()
        code = federation.submit(run_config_for(config, folder, resume=resume,
                                                reply_timeout=reply_timeout,
                                                join_timeout=join_timeout), on_line=show)
    except KeyboardInterrupt:
        echo(f"interrupted; stopping the Flower processes. Continue from the last checkpoint "
             f"with: clusterfed flower local --resume {folder}")
        raise
    finally:
        federation.stop()
        undo()
    if code != 0 or not summary_path.exists():
        # flwr run exits 0 when its ServerApp fails: the missing summary is what tells.
        why = f"flwr run exit code {code}" if code else "it ended without writing summary.json"
        raise ClusterfedError(f"the Flower run failed ({why}); logs in {federation.logs}")
    return json.loads(summary_path.read_text())
