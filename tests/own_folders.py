"""Own-data federations for the Flower tests: client folders written from a small scenario."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flower_cases import flower_config

from clusterfed import config as cfg
from clusterfed.data.export import client_dir, write_npz
from clusterfed.data.scenarios import Federation
from clusterfed.sim.simulation import build_federation_for


def write_client_folders(federation: Federation, root: Path,
                         clients: Sequence[int] | None = None) -> list[Path]:
    """root/client-K/ (scenario export's npz) for the listed clients, renumbered 0..n-1."""
    folders = []
    for k, c in enumerate(range(federation.num_clients) if clients is None else clients):
        folder = client_dir(root, k)
        folder.mkdir(parents=True, exist_ok=True)
        write_npz(federation.clients[c], folder)
        folders.append(folder)
    return folders


def scenario_federation(algorithm: dict[str, Any], rounds: int = 2) -> Federation:
    return build_federation_for(flower_config(algorithm, rounds))


def own_config(algorithm: dict[str, Any], rounds: int = 2, root: Path | None = None,
               **run: Any) -> dict[str, Any]:
    """flower_config's run over own data: the agreement only, or (in-process) data.root too."""
    config = flower_config(algorithm, rounds)
    federation = scenario_federation(algorithm, rounds)
    config["data"] = {"dataset": "folders", "n_classes": federation.n_classes,
                      "input_shape": list(federation.input_shape)}
    if root is not None:
        config["data"]["root"] = str(root)
    config["run"].update(run)
    return cfg.resolve(config)


# Opening files, seen through an audit hook (hooks cannot be removed: one dispatches to watches).
_WATCHES: list[Callable[[str, tuple[Any, ...]], None]] = []
_HOOKED: list[bool] = []
_EVENTS = ("open", "os.listdir", "os.scandir")


def _dispatch(event: str, args: tuple[Any, ...]) -> None:
    if _WATCHES and event in _EVENTS:
        for watch in list(_WATCHES):
            watch(event, args)


@contextmanager
def watch_opens(roots: Sequence[Path], serving: Callable[[], bool]
                ) -> Iterator[list[tuple[str, bool]]]:
    """Every file or folder under `roots` opened or listed meanwhile, with `serving()` then."""
    if not _HOOKED:
        sys.addaudithook(_dispatch)
        _HOOKED.append(True)
    prefixes = tuple(str(r) for r in roots)
    opened: list[tuple[str, bool]] = []

    def watch(event: str, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], str | bytes | os.PathLike):
            path = os.fsdecode(os.fspath(args[0]))
            if path.startswith(prefixes):
                opened.append((path, serving()))

    _WATCHES.append(watch)
    try:
        yield opened
    finally:
        _WATCHES.remove(watch)
