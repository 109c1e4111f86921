"""What may run in worker processes, and with how many threads: the usable cores, the models
whose tasks must stay in the parent (state, global random numbers, no pickle, an unguarded
main script), and one thread for the parent's own share."""

from __future__ import annotations

import os
import pickle
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


def process_obstacle(module: nn.Module) -> str | None:
    """Why tasks on `module` cannot run in worker processes, or None: results that would depend
    on the process (state, global random numbers), or workers that could not start."""
    return state_obstacle(module) or start_obstacle(module)


def state_obstacle(module: nn.Module) -> str | None:
    """Why `module`'s results would depend on the process that trains it, or None."""
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            return f"layer {name or 'model'} keeps running statistics ({type(m).__name__})"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"layer {name or 'model'} is dropout (the process's global generator)"
    return None


# `if __name__ == "__main__":`, the guard that keeps a script's run out of its workers.
_MAIN_GUARD = re.compile(r"""__name__\s*==\s*["']__main__["']""")


def needs_main(payload: bytes) -> bool:
    """Whether a pickle refers to the main module (a class defined in the script or the
    interactive session): only then must a worker import the main script."""
    return b"__main__" in payload


def start_obstacle(module: nn.Module) -> str | None:
    """Why workers could not start on `module`, or None.

    Workers start without the main script (`main_hidden`) unless the pickled module refers to
    it; then, as under spawn, each worker imports the script (as `__mp_main__`), so a script
    whose run is not guarded by `if __name__ == "__main__":` would run again in every worker,
    and a class defined in an interactive session (no script to import) cannot be found.
    """
    try:
        payload = pickle.dumps(module)
    except Exception as err:   # a lambda or a local class in the model
        return f"the model does not pickle ({type(err).__name__}: {err})"
    if not needs_main(payload):
        return None
    main = sys.modules.get("__main__")
    if getattr(main, "__spec__", None) is not None:     # python -m ...: importable
        return None
    script = getattr(main, "__file__", None)
    if script is None:
        return "the model's class is defined in an interactive session"
    try:
        guarded = _MAIN_GUARD.search(Path(script).read_text(errors="replace"))
    except OSError:
        guarded = None
    if not guarded:
        return (f"the model's class is defined in the main script {script}, which has no "
                f"`if __name__ == \"__main__\":` guard")
    return None


@contextmanager
def main_hidden(hide: bool) -> Iterator[None]:
    """While workers start, hide the main module's file and spec from multiprocessing, so
    that a worker does not import (run again) the main script when it needs nothing of it."""
    main = sys.modules.get("__main__")
    if not hide or main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


@contextmanager
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
