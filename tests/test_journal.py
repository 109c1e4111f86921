"""The step journal (sim/journal.py): a run stopped inside a long LOSSES step resumes with
the chunks it finished read back, and ends as an unbroken run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import comparable, tiny_config

from clusterfed.config import merge
from clusterfed.run_folder import JOURNAL
from clusterfed.sim.journal import StepJournal
from clusterfed.sim.simulation import Simulation
from clusterfed.tasks import ClientResult, ClientTask, TaskKind, numbered


class Counting:
    """The run's executor, counting the LOSSES tasks it runs; it stops the run (as a kill
    would) when it is asked for more than `stop_after` of them."""

    def __init__(self, inner, stop_after: int | None = None) -> None:
        self.inner, self.stop_after, self.losses = inner, stop_after, 0

    def run(self, tasks, round_index, step=0):
        asked = sum(t.kind is TaskKind.LOSSES for t in tasks)
        if self.stop_after is not None and self.losses + asked > self.stop_after:
            raise KeyboardInterrupt
        self.losses += asked
        return self.inner.run(tasks, round_index, step)

    def train_sizes(self):
        return self.inner.train_sizes()

    def test_sizes(self):
        return self.inner.test_sizes()


def lcfl_config() -> dict:
    """12 clients; LCFL's exchange (12 LOSSES tasks) is round 2's second step."""
    return merge(tiny_config("lcfl", scenario={"kind": "label_swap", "clients": 12,
                                                "clusters": 4},
                             train={"rounds": 3, "participation": 0.5, "batch_size": 20,
                                    "lr": 0.05}),
                 {"algorithm": {"name": "lcfl", "k": 4, "warmup_rounds": 2}})


def run(folder, executor_of, resume=False, chunk=5):
    probe = Simulation(lcfl_config())
    executor = executor_of(probe.executor)
    sim = Simulation(lcfl_config(), folder, executor=executor)
    sim.journal = StepJournal(folder, chunk=chunk, evaluations=100)   # 12 x 12 models
    return sim.run(resume=resume), executor


def test_a_run_stopped_inside_the_exchange_reads_its_finished_chunks_back(tmp_path):
    whole, counted = run(tmp_path / "whole", Counting)
    assert counted.losses == 12                       # one LOSSES task a client, once
    assert not (tmp_path / "whole" / JOURNAL).exists()   # cleared at the checkpoint

    # Chunks of 5: the stop comes when the third chunk is asked for, after two were written.
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", lambda inner: Counting(inner, stop_after=10))
    assert len(list((tmp_path / "cut" / JOURNAL).iterdir())) == 2
    resumed, again = run(tmp_path / "cut", Counting, resume=True)
    assert again.losses == 2                          # only the last chunk's two clients
    assert comparable(resumed) == comparable(whole)
    assert not (tmp_path / "cut" / JOURNAL).exists()


@pytest.mark.fast
def test_a_journal_of_other_tasks_is_not_read(tmp_path):
    """The chunks are keyed by the step's tasks (round, step, clients, models): the same
    tasks read them back, whole and equal; other models or another round do not."""
    def tasks(models):
        return numbered([ClientTask(c, TaskKind.LOSSES, models) for c in range(7)], 0)

    def execute(part):
        calls.append([t.client for t in part])
        return [ClientResult(t.client, TaskKind.LOSSES, 10, losses=t.params.sum(1) + t.client,
                             meta={"note": "x"}, task_id=t.id) for t in part]

    journal, calls = StepJournal(tmp_path, chunk=3), []
    models = np.arange(8, dtype=np.float32).reshape(2, 4)
    first = journal.run(tasks(models), 1, 1, execute)
    assert calls == [[0, 1, 2], [3, 4, 5], [6]]
    calls.clear()
    again = journal.run(tasks(models.copy()), 1, 1, execute)
    assert calls == []
    assert [(r.client, r.kind, r.task_id, dict(r.meta)) for r in again] == \
        [(r.client, r.kind, r.task_id, dict(r.meta)) for r in first]
    for a, b in zip(again, first, strict=True):
        np.testing.assert_array_equal(a.losses, b.losses)
    journal.run(tasks(models + 1), 1, 1, execute)          # other models
    assert len(calls) == 3
    calls.clear()
    journal.run(tasks(models), 2, 1, execute)              # another round
    assert len(calls) == 3
    journal.clear()
    assert not journal.path.exists()


def test_only_long_losses_steps_are_journalled():
    probe = Simulation(lcfl_config())
    state = probe.algorithm.init(probe.setup)
    losses = [ClientTask(c, TaskKind.LOSSES, state.models) for c in range(12)]
    train = [ClientTask(c, TaskKind.TRAIN, state.models[0], probe.spec) for c in range(12)]
    def takes(tasks, **limits):
        return StepJournal(Path("unused"), **limits).takes(tasks)

    assert takes(losses, chunk=5, evaluations=12) and not takes(losses, chunk=12)
    assert not takes(losses, chunk=5, evaluations=13)    # 12 tasks of one model each
    assert not takes(train, chunk=5, evaluations=1)
