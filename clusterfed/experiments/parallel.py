"""Independent runs side by side, each in its own process (`--jobs N`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from typing import Any, TypeVar

T = TypeVar("T")


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
