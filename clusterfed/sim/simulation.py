"""The simulator's round loop: sample, plan, execute, update, evaluate, record, checkpoint."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm import tqdm

from clusterfed import config as cfg
from clusterfed.algorithms import ClusterView, RoundContext, Setup, build_algorithm
from clusterfed.algorithms.cfl.maths import separation_gap
from clusterfed.client.privacy import ParameterTransform
from clusterfed.client.secret import read_secret_file
from clusterfed.client.tasks import (
    OWN_MODEL,
    ClientResult,
    ClientTask,
    TaskKind,
    TrainSpec,
    match_results,
)
from clusterfed.clustering.metrics import has_truth, truth_scores
from clusterfed.data import Federation, build_federation, load_dataset, own
from clusterfed.errors import ConfigError
from clusterfed.models import FlatModel, build_model
from clusterfed.run_folder import RunFolder, read_config
from clusterfed.sim.choice import build_executor
from clusterfed.sim.evaluation import (
    best_of_path,
    evaluate_adapted,
    evaluate_clients,
    evaluated_mean,
    least_test_loss,
    round_record,
    sampled_local_accuracy,
)
from clusterfed.sim.executor import Executor
from clusterfed.sim.sampling import sample_clients

log = logging.getLogger("clusterfed")


class Callback(Protocol):
    """Observes each round; returning True stops the run after that round."""

    def __call__(self, completed_rounds: int, record: Mapping[str, Any]) -> bool | None: ...


def train_spec(train: Mapping[str, Any]) -> TrainSpec:
    return TrainSpec(lr=float(train["lr"]), batch_size=int(train["batch_size"]),
                     epochs=train["local_epochs"], steps=train["local_steps"],
                     momentum=float(train["momentum"]), weight_decay=float(train["weight_decay"]),
                     clip_grad_norm=train["clip_grad_norm"])


def initial_params(module: torch.nn.Module, seed: int) -> None:
    """Re-initialise `module` in place from `seed`, leaving the global generator untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for m in module.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()


_DRAW_TAG = 0x1D2A


def initial_draws(module: torch.nn.Module, seed: int, first: np.ndarray,
                  transform: ParameterTransform | None) -> Callable[[int], np.ndarray]:
    """Setup.draw_initial: draw i > 0 re-initialises a copy of `module` from (seed, i)."""
    def draw(index: int) -> np.ndarray:
        if index == 0:
            return first.copy()
        fresh = copy.deepcopy(module)
        initial_params(fresh, int(np.random.SeedSequence([seed, index, _DRAW_TAG])
                                  .generate_state(1)[0]))
        vector = FlatModel(fresh).initial_vector().numpy()
        return vector if transform is None else transform.forward(vector)
    return draw


InitialModels = tuple[np.ndarray, Callable[[int], np.ndarray]]


def initial_models(module: torch.nn.Module, seed: int, transform: ParameterTransform | None
                   ) -> InitialModels:
    """The initial model as the server holds it (P-space under privacy) and Setup.draw_initial.

    `module` holds the initial weights. Wherever the privacy secret is, this is computed: in
    the simulator here, under Flower with client-held secrets on a node (`query.initial`).
    """
    initial = FlatModel(module).initial_vector().numpy()
    first = initial if transform is None else transform.forward(initial)
    return first, initial_draws(module, seed, first, transform)


def build_federation_for(config: Mapping[str, Any], data_dir: str | None = None) -> Federation:
    if config["data"]["dataset"] == own.FOLDERS:
        # Own data: the folders are the federation; no scenario applies.
        return own.federation_from_config(config["data"], config["seed"])
    data = dict(config["data"])
    name, root = data.pop("dataset"), data.pop("root", None)
    dataset = load_dataset(name, data_dir or root, **data)
    return build_federation(dataset, config["scenario"], config["seed"])


def privacy_transform(config: Mapping[str, Any], size: int, secret: bytes | None = None
                      ) -> ParameterTransform | None:
    """The clients' side of run.privacy for a model of `size` parameters, or None.

    The clients' shared secret, never in Setup: `secret` (a Flower node's own file), else the
    file run.privacy_secret_file names, else run.privacy_seed or a seed derived from the run's
    seed (both known to whoever holds the config).
    """
    run = config["run"]
    if run["privacy"] == "none":
        return None
    if secret is None and run.get("privacy_secret_file"):
        secret = read_secret_file(run["privacy_secret_file"])
    if secret is not None:
        if run["privacy_seed"] is not None:
            raise ConfigError("run.privacy_seed and a privacy secret file are both given: the "
                              "file is the clients' secret; drop run.privacy_seed")
        return ParameterTransform.from_secret(run["privacy"], secret, size)
    seed = run["privacy_seed"] if run["privacy_seed"] is not None else config["seed"] + 0x5EC
    return ParameterTransform.from_seed(run["privacy"], seed, size)


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
        self.config = cfg.resolve(config)
        self.folder = RunFolder(Path(out_dir)) if out_dir is not None else None
        self.federation = federation or build_federation_for(self.config, data_dir)
        self.callbacks = list(callbacks)
        seed = self.config["seed"]
        if module is None:
            module = build_model(**{"input_shape": self.federation.input_shape,
                                    "n_classes": self.federation.n_classes,
                                    **self.config["model"]})
            initial_params(module, seed)
        self.model = FlatModel(module)
        self.algorithm = build_algorithm(self.config["algorithm"])
        self.spec = train_spec(self.config["train"])
        # Only the in-process executor needs the transform; a given one holds its own (or its
        # nodes do), so a server never derives one, let alone reads a secret file.
        transform = (privacy_transform(self.config, self.model.size)
                     if executor is None or initial is None else None)
        # The initial vector is read before the executor moves the module to its device.
        first, draw = initial() if initial is not None else initial_models(module, seed,
                                                                           transform)
        if first.shape != (self.model.size,):
            raise ConfigError(f"the initial model has shape {first.shape}; the model has "
                              f"{self.model.size} parameters")
        # An executor built here is closed here, when a run ends (worker processes stop);
        # a given one is its owner's to close.
        self.owns_executor = executor is None
        self.executor: Executor = executor or build_executor(
            self.config["run"], self.model, self.federation, seed, transform,
            self.config["eval"]["validation_fraction"], self.config["train"])
        # The layout is hidden under the privacy transform: coordinates are permuted there.
        layout = None if self.config["run"]["privacy"] != "none" else tuple(
            (n, tuple(s)) for n, s in zip(self.model.names, self.model.shapes, strict=True))
        self.setup = Setup(self.federation.num_clients, first, self.executor.train_sizes(), seed,
                           layout, draw_initial=draw)
        # Protocol 'local' evaluates each client's own last trained model, kept here.
        self.own_models: dict[int, np.ndarray] | None = (
            {} if self.config["eval"]["protocol"] in ("local", "sampled_local") else None)
        # Protocol 'sampled_local': this round's sampled clients and their models from before it.
        self.previous_models: dict[int, np.ndarray] = {}
        self.round_sampled = np.arange(self.federation.num_clients)

    # One round -----------------------------------------------------------------------------

    def _execute(self, tasks: Sequence[ClientTask], r: int, step: int,
                 events: list[dict[str, Any]]) -> list[ClientResult]:
        """Run tasks; drop results with NaN or Inf (logged), keep the rest."""
        # A remote executor may return fewer results than tasks (a client that never answered).
        kept = []
        for task, result in match_results(tasks, self.executor.run(tasks, r, step)):
            if result.is_finite():
                kept.append(result)
                if (result.kind is TaskKind.TRAIN and self.own_models is not None
                        and task.meta.get(OWN_MODEL, True)):
                    trained = task.params + result.update
                    self.own_models[result.client] = trained.astype(np.float32)
            else:
                log.warning("round %d: rejected the %s result of client %d: it holds NaN or Inf",
                            r + 1, result.kind.value, result.client)
                events.append({"round": r + 1, "type": "rejected_result", "client": result.client,
                               "task": result.kind.value, "reason": "non-finite values"})
        return kept

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
            return self._run(resume)
        finally:
            self.close()

    def _run(self, resume: bool) -> dict[str, Any]:
        rounds = self.config["train"]["rounds"]
        state, start, elapsed, last_assignment = self.algorithm.init(self.setup), 0, 0.0, None
        if resume:
            if self.folder is None:
                raise ConfigError("resuming needs the run folder")
            ckpt = self.folder.load_checkpoint()
            if ckpt is not None:
                state, start, elapsed = ckpt["state"], ckpt["round"], ckpt["wall_seconds"]
                last_assignment = ckpt["assignment"]
                if self.own_models is not None:
                    self.own_models = dict(ckpt["own_models"])
            self.folder.truncate_after(start)
            log.info("resuming from round %d", start)
        elif self.folder is not None:
            self.folder.start(self.config)
        threads_before = torch.get_num_threads()
        if self.config["run"]["threads"]:
            torch.set_num_threads(int(self.config["run"]["threads"]))

        began = time.perf_counter()
        every = self.config["eval"]["every"]
        checkpoint_every = self.config["run"]["checkpoint_every"]
        record: dict[str, Any] = {}
        bar = tqdm(total=rounds, initial=start, desc=self.config["algorithm"]["name"],
                   disable=not self.config["run"]["progress"], leave=False, unit="round")
        try:
            for r in range(start, rounds):
                state, record, events = self._round(state, r)
                view = self.algorithm.clusters(state)
                if last_assignment is None or not np.array_equal(view.assignment, last_assignment):
                    events.append({"round": r + 1, "type": "assignment",
                                   "assignment": view.assignment.tolist()})
                    last_assignment = view.assignment.copy()
                if (r + 1) % every == 0 or r + 1 == rounds:
                    record.update(self._evaluate(state, view, r))
                    bar.set_postfix(acc=f"{record['mean_accuracy']:.3f}",
                                    clusters=record["n_clusters"])
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
                            "wall_seconds": elapsed + time.perf_counter() - began,
                            "own_models": self.own_models or {}})
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
        return summary

    def _evaluate(self, state: Any, view: ClusterView, r: int) -> dict[str, Any]:
        """The evaluation protocol's per-client figures, as one metrics record (after round r)."""
        true = self.federation.true_clusters
        target = self.config["eval"]["target_accuracy"]
        if self.config["eval"]["protocol"] == "sampled_local":
            record = round_record(evaluate_clients(self.executor, view, self.own_models), view,
                                  true, target)
            record["local_mean_accuracy"] = record["mean_accuracy"]
            record["mean_accuracy"] = sampled_local_accuracy(
                self.executor, view, self.previous_models, self.round_sampled,
                self.executor.test_sizes())
            return record
        if self.config["eval"]["protocol"] == "min_test_loss":
            figures, chosen = least_test_loss(self.executor, view)
            record = round_record(figures, view, true, target)
            served = evaluate_clients(self.executor, view, None)
            record.update({"served_mean_accuracy": evaluated_mean(served[:, 1]),
                           "test_chose_served": float(np.mean(chosen == view.assignment))})
            return record
        adaptation = getattr(self.algorithm, "adaptation", None)
        spec = None
        # An algorithm's own test-time adaptation replaces the 'cluster' and 'local' protocols'
        # models; 'best_of_path' chooses among path models and is left as it is.
        if adaptation is not None and self.config["eval"]["protocol"] != "best_of_path":
            spec = adaptation(state, self.spec.decayed(float(self.config["train"]["lr_decay"]),
                                                       r))
        if spec is not None:
            # Test-time adaptation: each client fine-tunes its served model, then is tested.
            served = evaluate_clients(self.executor, view, None)
            record = round_record(evaluate_adapted(self.executor, view, spec, r), view, true,
                                  target)
            record["served_mean_accuracy"] = evaluated_mean(served[:, 1])
            return record
        if self.config["eval"]["protocol"] != "best_of_path":
            record = round_record(evaluate_clients(self.executor, view, self.own_models), view,
                                  true, target)
            if self.own_models is not None and self.config["eval"]["also_cluster"]:
                # The other protocol too: each client's cluster model (PACFL reports both).
                acc = evaluate_clients(self.executor, view, None)[:, 1]
                record.update({"cluster_mean_accuracy": evaluated_mean(acc),
                               "cluster_per_client_accuracy": [round(float(a), 6)
                                                               for a in acc]})
            return record
        chosen, depth = best_of_path(self.executor, self.algorithm, state, view)
        record = round_record(chosen, view, true, target)
        leaf = evaluate_clients(self.executor, view, None)
        record.update({"leaf_mean_accuracy": evaluated_mean(leaf[:, 1]),
                       "chosen_path_depth": depth.tolist()})
        return record

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
                                              "clients_at_target") if k in last}},
            # Without a truth every figure that needs it is None (null), never a made-up score.
            "clustering": {"assignment": view.assignment.tolist(),
                           "true_assignment": true.tolist() if has_truth(true) else None,
                           "n_clusters": view.num_clusters,
                           **truth_scores(true, view.assignment)},
        }


def run_config(config: Mapping[str, Any], out_dir: str | Path | None = None, *,
               data_dir: str | None = None, callbacks: Sequence[Callback] = (),
               federation: Federation | None = None, module: torch.nn.Module | None = None,
               executor: Executor | None = None) -> dict[str, Any]:
    """Run one configuration from scratch; returns its summary."""
    sim = Simulation(config, out_dir, federation=federation, data_dir=data_dir,
                     callbacks=callbacks, module=module, executor=executor)
    return sim.run()


def resume_run(run_dir: str | Path, *, data_dir: str | None = None,
               callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Continue a run folder from its last checkpoint; the numbers equal an unbroken run's."""
    run_dir = Path(run_dir)
    sim = Simulation(read_config(run_dir), run_dir, data_dir=data_dir, callbacks=callbacks)
    return sim.run(resume=True)
