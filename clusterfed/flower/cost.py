"""What one message costs a ClientApp process: a Flower mod that logs it, when asked to.

With `CLUSTERFED_MESSAGE_COST_LOG=FILE` in the ClientApp's environment (a SuperNode passes its
own environment on), every message appends one JSON line to FILE: the CPU seconds this process
spent before the handler since its previous message (for its first message: the interpreter,
the imports, the FAB and the app's loading), the handler's CPU and wall seconds, and whether the
handler built the node's federation. Without the variable the mod only calls the handler.
`benchmarks/flower_message_cost.py` reads these lines.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOG_ENV = "CLUSTERFED_MESSAGE_COST_LOG"

_seen = {"messages": 0, "cpu_after": 0.0}   # this process's messages and CPU at the last end


def process_start_time() -> float | None:
    """When this process started (seconds since the epoch), from /proc; None elsewhere."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, ValueError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _population_ids() -> set[int]:
    # Read only: which federations clusterfed.flower.node holds (a new id: built by this message).
    from clusterfed.flower import node

    return {id(p) for p in getattr(node, "_POPULATIONS", {}).values()}


def message_cost(msg: Any, context: Any, call_next: Callable[[Any, Any], Any]) -> Any:
    """Flower mod: run the handler; log its cost when LOG_ENV names a file."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return call_next(msg, context)
    entered, cpu_entered = time.time(), time.process_time()
    before = _population_ids()
    reply = call_next(msg, context)
    cpu_done, done = time.process_time(), time.time()
    first = _seen["messages"] == 0
    started = process_start_time() if first else None
    record = {
        "pid": os.getpid(), "type": msg.metadata.message_type, "group": msg.metadata.group_id,
        "first_in_process": first, "entered": entered, "done": done,
        "cpu_before": cpu_entered - _seen["cpu_after"],
        "wall_before": None if started is None else entered - started,
        "cpu_handler": cpu_done - cpu_entered, "wall_handler": done - entered,
        "built": bool(_population_ids() - before),
    }
    _seen["messages"] += 1
    _seen["cpu_after"] = cpu_done
    # One short line per write with O_APPEND: the nodes' processes may share the file.
    with open(path, "a") as log:
        log.write(json.dumps(record) + "\n")
    return reply
