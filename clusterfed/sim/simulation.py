"""The simulator's round loop: sample, plan, execute, update, evaluate, record, checkpoint."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm import tqdm

from clusterfed.algorithms import ClusterView, RoundContext
from clusterfed.algorithms.newcomers import newcomer_figures, newcomer_ids
from clusterfed.clustering.bipartition import separation_gap
from clusterfed.clustering.metrics import (
    grouping_scores,
    has_truth,
    one_hot,
    same_partition,
    shares_error,
    truth_scores,
)
from clusterfed.data import Federation
from clusterfed.errors import ConfigError
from clusterfed.run_folder import RunFolder, read_config, read_jsonl
from clusterfed.sampling import sample_clients
from clusterfed.sim.build import (  # noqa: F401 (the building helpers, imported from here too)
    InitialModels,
    build_federation_for,
    build_run,
    initial_draws,
    initial_models,
    initial_params,
    privacy_transform,
    train_spec,
)
from clusterfed.sim.executor import Executor
from clusterfed.sim.journal import StepJournal
from clusterfed.sim.protocols import (
    ADAPTATION_STEP,
    PROTOCOLS,
    EvalContext,
    Pairs,
    no_mixture_message,
    run_protocol,
)
from clusterfed.tasks import ClientResult, ClientTask, TaskKind, match_results, numbered
from clusterfed.trackers import RunTrackers, check_trackers

log = logging.getLogger("clusterfed")


class Callback(Protocol):
    """Observes each round; returning True stops the run after that round."""

    def __call__(self, completed_rounds: int, record: Mapping[str, Any]) -> bool | None: ...


class Simulation:
    """One run of one algorithm on one federation, optionally recorded in a run folder."""

    def __init__(self, config: Mapping[str, Any], out_dir: str | Path | None = None, *,
                 federation: Federation | None = None, data_dir: str | None = None,
                 callbacks: Sequence[Callback] = (), module: torch.nn.Module | None = None,
                 executor: Executor | None = None,
                 initial: Callable[[], InitialModels] | None = None) -> None:
        """`module`, if given, replaces the config's model; its current weights are the start.

        `executor`, if given, runs the client tasks instead of the in-process sequential one.
        `initial`, if given, supplies the initial models (`initial_models`) from where the
        privacy secret is, instead of computing them here (Flower with client-held secrets).
        """
        built = build_run(config, federation=federation, data_dir=data_dir, module=module,
                          executor=executor, initial=initial)
        self.config, self.federation, self.model = built.config, built.federation, built.model
        self.algorithm, self.spec, self.setup = built.algorithm, built.spec, built.setup
        self.executor, self.owns_executor = built.executor, built.owns_executor
        self.threads = built.threads   # torch's threads during the run (sim/choice.py)
        # With scenario.drift the federation changes at a round: `self.federation` is the
        # current round's (its data in the executor, its truth scoring the clustering).
        self.scenario_federation, self.executor_for = built.federation, built.executor_for
        drift = built.federation.drift
        if drift is not None and drift.round > self.config["train"]["rounds"]:
            raise ConfigError(f"scenario.drift.round={drift.round} is after the last round "
                              f"(train.rounds={self.config['train']['rounds']}): the clients "
                              f"would never drift")
        self.folder = RunFolder(Path(out_dir)) if out_dir is not None else None
        # A long step's results, kept in chunks for a resume (sim/journal.py): only where
        # there are checkpoints to resume from.
        self.journal = (StepJournal(self.folder.path) if self.folder is not None
                        and self.config["run"]["checkpoint_every"] else None)
        if self.config["run"]["loggers"]:
            # Refused here, before a round: no run folder, or a tracker's extra missing.
            check_trackers(self.config, self.folder and self.folder.path)
        self.callbacks = list(callbacks)
        # Protocol 'local' evaluates each client's own last trained model, kept here.
        self.own_models: dict[int, np.ndarray] | None = (
            {} if self.config["eval"]["protocol"] in ("local", "sampled_local") else None)
        # Protocol 'sampled_local': this round's sampled clients and their models from before it.
        self.previous_models: dict[int, np.ndarray] = {}
        self.round_sampled = np.arange(self.federation.num_clients)
        self.next_id = 0   # the next task id of the round

    # One round -----------------------------------------------------------------------------

    def _hold_round(self, round_number: int) -> bool:
        """Hold the federation of `round_number` (1-based; 0: before the first) with an
        executor on its data; True when that switched the data (scenario.drift)."""
        federation = self.scenario_federation.at_round(round_number)
        if federation is self.federation:
            return False
        assert self.executor_for is not None, "build_run refuses drift with a given executor"
        kept = self._optimizer_states()   # the clients' optimisers outlive their data's change
        self.close()   # a processes executor's workers map the old data: start new ones
        self.executor = self.executor_for(federation)
        self._restore_optimizer_states(kept)
        self.federation = federation
        return True

    def _execute(self, tasks: Sequence[ClientTask], r: int, step: int,
                 events: list[dict[str, Any]]) -> list[ClientResult]:
        """Run tasks; drop results with NaN or Inf (logged), keep the rest."""
        # A remote executor may return fewer results than tasks (a client that never answered).
        tasks = self._numbered(tasks)
        if self.spec.optimizer_state == "kept":
            refuse_shared_optimizers(tasks, str(self.config["algorithm"]["name"]))
        if self.journal is not None and self.journal.takes(tasks):
            answered = self.journal.run(tasks, r, step,
                                        lambda part: self.executor.run(part, r, step))
        else:
            answered = self.executor.run(tasks, r, step)
        kept = []
        for task, result in match_results(tasks, answered):
            if result.is_finite():
                kept.append(result)
                if (result.kind is TaskKind.TRAIN and self.own_models is not None
                        and task.own_model):
                    trained = task.params + result.update
                    self.own_models[result.client] = trained.astype(np.float32)
            else:
                log.warning("round %d: rejected the %s result of client %d: it holds NaN or Inf",
                            r + 1, result.kind.value, result.client)
                events.append({"round": r + 1, "type": "rejected_result", "client": result.client,
                               "task": result.kind.value, "reason": "non-finite values"})
        return kept

    def _numbered(self, tasks: Sequence[ClientTask]) -> list[ClientTask]:
        """The tasks with ids unique within the round (the count restarts every round)."""
        out = numbered(tasks, self.next_id)
        self.next_id += len(out)
        return out

    def _executor_events(self) -> list[dict[str, Any]]:
        """Events a remote executor logged (missing clients, rejected replies, joins)."""
        drain = getattr(self.executor, "drain_events", None)
        return list(drain()) if drain is not None else []

    def _separation_gaps(self, diagnostics: Mapping[str, Mapping[str, np.ndarray]]
                         ) -> dict[str, float]:
        """g(alpha) of each reported similarity matrix against the true clusters (CFL Eq. 48);
        none without a truth."""
        true = self.federation.true_clusters
        if not has_truth(true):
            return {}
        return {label: round(separation_gap(d["similarity"], true[np.asarray(d["members"])]), 6)
                for label, d in diagnostics.items() if "similarity" in d and "members" in d}

    def _round(self, state: Any, r: int) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
        train = self.config["train"]
        sampled = sample_clients(self.config["seed"], r, self.federation.num_clients,
                                 train["participation"])
        ctx = RoundContext(r, sampled, self.spec.decayed(float(train["lr_decay"]), r))
        self.next_id = 0
        if self.config["eval"]["protocol"] == "sampled_local":
            assert self.own_models is not None
            self.round_sampled = sampled
            self.previous_models = {int(c): self.own_models[int(c)] for c in sampled
                                    if int(c) in self.own_models}
        metrics: dict[str, Any] = {}
        events: list[dict[str, Any]] = []
        losses: list[float] = []
        gaps: dict[str, float] = {}
        while True:
            tasks = self.algorithm.plan(state, ctx)
            results = self._execute(tasks, r, ctx.step, events)
            losses += [x.loss for x in results if x.kind is TaskKind.TRAIN]
            upd = self.algorithm.update(state, ctx, results)
            state = upd.state
            metrics.update(upd.metrics)
            gaps.update(self._separation_gaps(upd.diagnostics))
            events += [{"round": r + 1, **e} for e in upd.events]
            if upd.round_done:
                break
            ctx = replace(ctx, step=ctx.step + 1)
        record = {"round": r + 1, "sampled": len(sampled),
                  "train_loss": float(np.mean(losses)) if losses else None, **metrics}
        if gaps:
            record["separation_gap"] = gaps
        return state, record, events

    # The whole run --------------------------------------------------------------------------

    def close(self) -> None:
        """Release what the executor holds (worker processes, shared memory), if it is ours."""
        close = getattr(self.executor, "close", None)
        if self.owns_executor and close is not None:
            close()

    def __enter__(self) -> Simulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, resume: bool = False) -> dict[str, Any]:
        """Run (or resume) to the last round; the executor is closed at the end, also when the
        run raises or is interrupted (a later call starts its workers again)."""
        try:
            if self.folder is None:
                return self._run(resume)
            with self.folder.writing():   # a second run into this folder is refused
                return self._run(resume)
        finally:
            self.close()

    def _run(self, resume: bool) -> dict[str, Any]:
        state, start, elapsed, last_assignment = self.algorithm.init(self.setup), 0, 0.0, None
        # The round after which the clients' partition last changed (checkpointed: a resumed
        # run reports what the uninterrupted one would).
        self.settled_round: int | None = None
        if self.config["eval"]["protocol"] == "mixture" and \
                self.algorithm.clusters(state).weights is None:
            # Refused before round 1, not at the first evaluation.
            raise ConfigError(no_mixture_message(str(self.config["algorithm"]["name"])))
        if resume:
            if self.folder is None:
                raise ConfigError("resuming needs the run folder")
            ckpt = self.folder.load_checkpoint()
            if ckpt is not None:
                state, start, elapsed = ckpt["state"], ckpt["round"], ckpt["wall_seconds"]
                last_assignment = ckpt["assignment"]
                self.settled_round = (ckpt["settled_round"] if "settled_round" in ckpt
                                      else settled_from_events(self.folder.path, start))
                if self.own_models is not None:
                    self.own_models = dict(ckpt["own_models"])
                self._restore_optimizer_states(ckpt.get("optimizer_states", {}))
            self.folder.truncate_after(start)
            log.info("resuming from round %d", start)
        elif self.folder is not None:
            self.folder.start(self.config)
        self._hold_round(start)
        trackers = RunTrackers.open(self.config, self.folder and self.folder.path, resume=resume)
        try:
            summary = self._loop(state, start, elapsed, last_assignment, trackers)
        except BaseException:
            if trackers is not None:
                trackers.close(failed=True)
            raise
        if trackers is not None:
            trackers.close()
        return summary

    def _loop(self, state: Any, start: int, elapsed: float, last_assignment: np.ndarray | None,
              trackers: RunTrackers | None) -> dict[str, Any]:
        rounds = self.config["train"]["rounds"]
        threads_before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)

        began = time.perf_counter()
        every = self.config["eval"]["every"]
        checkpoint_every = self.config["run"]["checkpoint_every"]
        record: dict[str, Any] = {}
        bar = tqdm(total=rounds, initial=start, desc=self.config["algorithm"]["name"],
                   disable=not self.config["run"]["progress"], leave=False, unit="round")
        try:
            for r in range(start, rounds):
                drifted = self._hold_round(r + 1)
                state, record, events = self._round(state, r)
                if drifted:
                    moved = self.federation.info["drift"]
                    events.insert(0, {"round": r + 1, "type": "drift",
                                      **{k: moved[k] for k in ("clients", "from", "to")}})
                view = self.algorithm.clusters(state)
                if last_assignment is None or not np.array_equal(view.assignment, last_assignment):
                    if last_assignment is None or not same_partition(view.assignment,
                                                                     last_assignment):
                        self.settled_round = r + 1
                    events.append({"round": r + 1, "type": "assignment",
                                   "assignment": view.assignment.tolist()})
                    last_assignment = view.assignment.copy()
                if (r + 1) % every == 0 or r + 1 == rounds:
                    record.update(self._evaluate(state, view, r))
                    bar.set_postfix(acc=f"{record['mean_accuracy']:.3f}",
                                    clusters=record["n_clusters"])
                if self.scenario_federation.drift is not None and "ari" not in record:
                    # Under drift every round's clustering is scored against its own truth.
                    record.update(truth_scores(self.federation.true_clusters, view.assignment))
                bar.update(1)
                events += self._executor_events()
                stop = any(cb(r + 1, record) for cb in self.callbacks)
                if self.folder is not None:
                    for e in events:
                        self.folder.append("events.jsonl", e)
                    self.folder.append("metrics.jsonl", record)
                    if checkpoint_every and ((r + 1) % checkpoint_every == 0 or r + 1 == rounds):
                        self.folder.save_checkpoint({
                            "round": r + 1, "state": state, "assignment": last_assignment,
                            "settled_round": self.settled_round,
                            "wall_seconds": elapsed + time.perf_counter() - began,
                            "own_models": self.own_models or {},
                            "optimizer_states": self._optimizer_states()})
                        if self.journal is not None:
                            self.journal.clear()   # the checkpoint holds the round's results
                if trackers is not None:
                    trackers.round(record, events)
                if stop:
                    log.info("stopped by a callback after round %d", r + 1)
                    break
        finally:
            bar.close()
            torch.set_num_threads(threads_before)   # the setting is this run's, not the process's
        self.state = state
        summary = self._summary(state, record, elapsed + time.perf_counter() - began)
        if self.folder is not None:
            self.folder.write_summary(summary)
            if trackers is not None:
                trackers.finished(summary, read_jsonl(self.folder.path / "metrics.jsonl"))
        return summary

    def _optimizer_states(self) -> dict[int, dict[str, np.ndarray]]:
        """The clients' kept optimiser states (train.optimizer_state=kept) where the executor
        holds them in this process; a Flower executor's live on its nodes."""
        kept = getattr(self.executor, "kept_states", None)
        return kept() if kept is not None else {}

    def _restore_optimizer_states(self, states: dict[int, dict[str, np.ndarray]]) -> None:
        restore = getattr(self.executor, "restore_kept_states", None)
        if restore is not None:
            restore(states)
        elif self.spec.optimizer_state == "kept":
            log.warning("resuming: the clients' kept optimiser states live on the nodes and "
                        "were not checkpointed; each client's optimiser starts afresh")

    def _evaluate(self, state: Any, view: ClusterView, r: int) -> dict[str, Any]:
        """The evaluation protocol's metrics record after round r: its tasks run through the
        executor like the algorithm's (numbered in the round), scored by the registry's
        protocol."""
        ev = self.eval_context(state, view, r)
        return run_protocol(PROTOCOLS[self.config["eval"]["protocol"]], ev,
                            lambda tasks: self._run_evaluation(tasks, r))

    def eval_context(self, state: Any, view: ClusterView, r: int) -> EvalContext:
        protocol = self.config["eval"]["protocol"]
        adaptation = getattr(self.algorithm, "adaptation", None)
        spec = None
        # An algorithm's own test-time adaptation replaces the 'cluster' and 'local' protocols'
        # models; the other protocols choose among models and are left as they are.
        if adaptation is not None and protocol in ("cluster", "local"):
            # A test-time fine-tune starts its own optimiser: it must not move the client's
            # kept training state (train.optimizer_state), or evaluating would change training.
            fresh = replace(self.spec, optimizer_state="fresh")
            spec = adaptation(state, fresh.decayed(float(self.config["train"]["lr_decay"]), r))
        paths = getattr(self.algorithm, "path_models", None)
        return EvalContext(
            view=view, true_clusters=self.federation.true_clusters,
            test_sizes=self.executor.test_sizes(),
            target_accuracy=self.config["eval"]["target_accuracy"],
            own_models=self.own_models, previous_models=self.previous_models,
            sampled=self.round_sampled, also_cluster=bool(self.config["eval"]["also_cluster"]),
            adaptation=spec,
            path_models=None if paths is None else (lambda c: paths(state, c)),
            split=self.config["eval"]["split"])

    def _run_evaluation(self, tasks: Sequence[ClientTask], r: int) -> Pairs:
        """One phase of an evaluation protocol (its TRAIN tasks seeded apart from training)."""
        tasks = self._numbered(tasks)
        return match_results(tasks, self.executor.run(tasks, r, ADAPTATION_STEP))

    def _summary(self, state: Any, last: Mapping[str, Any], wall: float) -> dict[str, Any]:
        view = self.algorithm.clusters(state)
        true = self.federation.true_clusters
        if "per_client_accuracy" not in last:   # stopped between evaluations
            last = self._evaluate(state, view, int(last.get("round", 1)) - 1)
        return {
            "algorithm": self.config["algorithm"]["name"],
            "rounds": int(last.get("round", self.config["train"]["rounds"])),
            "seed": self.config["seed"],
            "wall_seconds": round(wall, 3),
            "final": {"mean_accuracy": last["mean_accuracy"], "mean_loss": last["mean_loss"],
                      "per_client_accuracy": last["per_client_accuracy"],
                      "per_true_cluster_accuracy": last["per_true_cluster_accuracy"],
                      **{k: last[k] for k in ("cluster_mean_accuracy",
                                              "cluster_per_client_accuracy",
                                              "clients_at_target", "unevaluated_clients")
                         if k in last},
                      **self._newcomers_figures(last)},
            # Without a truth every figure that needs it is None (null), never a made-up score.
            "clustering": {"assignment": view.assignment.tolist(),
                           "true_assignment": true.tolist() if has_truth(true) else None,
                           "n_clusters": view.num_clusters,
                           "settled_round": self.settled_round,
                           **truth_scores(true, view.assignment),
                           **grouping_scores(self.federation.groupings, view.assignment),
                           **self._shares_score(state, view)},
        }

    def _newcomers_figures(self, last: Mapping[str, Any]) -> dict[str, Any]:
        """The late clients' mean accuracies (PACFL's Table 3 figure), where there are any."""
        ids = newcomer_ids(self.config)
        return {"newcomers": newcomer_figures(last, ids)} if ids else {}

    def _shares_score(self, state: Any, view: ClusterView) -> dict[str, float]:
        """Against a mixture scenario's true shares: how far the method's weights on its
        models are (its mixture weights, FedSoft's importance, else its hard assignment)."""
        shares = self.federation.info.get("shares")
        if shares is None:
            return {}
        if view.weights is not None:
            weights = view.weights
        elif hasattr(self.algorithm, "soft_assignment"):
            weights = self.algorithm.soft_assignment(state)
        else:
            weights = one_hot(view.assignment, len(view.models))
        return {"shares_error": round(shares_error(np.asarray(shares), weights), 6)}


def settled_from_events(folder: Path, rounds: int) -> int | None:
    """The round after which the partition last changed, from a run folder's assignment
    events up to `rounds` (a checkpoint written before `settled_round` was kept)."""
    path = folder / "events.jsonl"
    if not path.exists():
        return None
    settled, last = None, None
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event.get("type") != "assignment" or event["round"] > rounds:
            continue
        found = np.asarray(event["assignment"])
        if last is None or not same_partition(found, last):
            settled = int(event["round"])
        last = found
    return settled


def run_config(config: Mapping[str, Any], out_dir: str | Path | None = None, *,
               data_dir: str | None = None, callbacks: Sequence[Callback] = (),
               federation: Federation | None = None, module: torch.nn.Module | None = None,
               executor: Executor | None = None) -> dict[str, Any]:
    """Run one configuration from scratch; returns its summary."""
    sim = Simulation(config, out_dir, federation=federation, data_dir=data_dir,
                     callbacks=callbacks, module=module, executor=executor)
    return sim.run()


def refuse_shared_optimizers(tasks: Sequence[ClientTask], algorithm: str) -> None:
    """train.optimizer_state=kept keeps one optimiser a client: refuse a step that trains two
    models on one client (FedEM's components), whose steps would share its moments."""
    trained: set[int] = set()
    for task in tasks:
        if task.kind is TaskKind.TRAIN:
            if task.client in trained:
                raise ConfigError(
                    f"train.optimizer_state=kept keeps one optimiser a client, but {algorithm} "
                    f"trains several models on client {task.client} in one step; use "
                    f"train.optimizer_state=fresh")
            trained.add(task.client)


def resume_run(run_dir: str | Path, *, data_dir: str | None = None,
               callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Continue a run folder from its last checkpoint; the numbers equal an unbroken run's."""
    run_dir = Path(run_dir)
    sim = Simulation(read_config(run_dir), run_dir, data_dir=data_dir, callbacks=callbacks)
    return sim.run(resume=True)
