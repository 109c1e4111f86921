"""Independent runs side by side, each in its own process (`--jobs N`), and the federation
a process keeps between its runs."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from typing import Any, TypeVar

from clusterfed.errors import ConfigError

T = TypeVar("T")


def check_jobs(jobs: int) -> None:
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ConfigError(f"jobs must be a positive whole number, got {jobs!r}")


def federation_key(config: Mapping[str, Any]) -> str:
    """What a run's federation is built from: its data, scenario and seed."""
    return json.dumps([config["data"], config["scenario"], config["seed"]], sort_keys=True,
                      default=str)


class LatestFederation:
    """The federation of the last (data, scenario, seed) asked for. Runs come grouped by it
    (a reproduction's seed, a benchmark's cell row); keeping every one would hold a whole
    benchmark's data at once."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.federation: Any = None

    def hold(self, config: Mapping[str, Any], federation: Any) -> None:
        """Keep a federation built elsewhere for `config`'s data, scenario and seed."""
        self.key, self.federation = federation_key(config), federation

    def get(self, config: Mapping[str, Any], data_dir: str | None) -> Any:
        from clusterfed.sim.simulation import build_federation_for

        key = federation_key(config)
        if key != self.key:
            self.key, self.federation = None, None   # the old one goes before the new is built
            self.federation, self.key = build_federation_for(config, data_dir), key
        return self.federation


# A worker process's federation, kept between the runs it is given.
WORKER_FEDERATION = LatestFederation()


def in_processes(fn: Callable[..., T], calls: Sequence[tuple[Any, ...]], workers: int, *,
                 started: Callable[[int], None] | None = None,
                 finished: Callable[[int, T], None] | None = None) -> list[T]:
    """fn(*calls[i]) for every i, at most `workers` at a time; results in the calls' order.

    Each call is submitted as a worker frees up, so `started(i)` says when it really starts;
    `finished(i, result)` is called as it ends. A call that raises ends this function with its
    error once the calls still going have finished (none is cut short; on Ctrl-C the workers
    stop too). Spawned, not forked: torch's threads do not survive a fork. `fn` must be a
    module-level function and its arguments picklable."""
    results: list[Any] = [None] * len(calls)
    waiting = list(range(len(calls)))
    running: dict[Future[T], int] = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        try:
            while waiting or running:
                while waiting and len(running) < workers:
                    i = waiting.pop(0)
                    if started is not None:
                        started(i)
                    running[pool.submit(fn, *calls[i])] = i
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    i = running.pop(future)
                    results[i] = future.result()
                    if finished is not None:
                        finished(i, results[i])
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return results
