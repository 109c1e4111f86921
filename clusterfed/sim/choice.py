"""Which device and which executor a run uses (`run.device`, `run.executor`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from clusterfed.client.privacy import ParameterTransform
from clusterfed.data.federation import Federation
from clusterfed.errors import ConfigError
from clusterfed.models.flat import FlatModel
from clusterfed.models.grouped import grouped_obstacle
from clusterfed.sampling import clients_per_round
from clusterfed.sim.executor import Executor, SequentialExecutor
from clusterfed.sim.grouped import GroupedExecutor
from clusterfed.sim.processes import (
    ProcessExecutor,
    start_obstacle,
    state_obstacle,
    usable_cores,
)
from clusterfed.sim.vectorised import VectorisedExecutor

log = logging.getLogger("clusterfed")
# The one line saying which executor and threads a run uses (the CLI shows it by default).
choice_log = logging.getLogger("clusterfed.executor")

EXECUTORS = ("auto", "sequential", "vectorised", "grouped", "processes")
# `auto` picks worker processes on a CPU when the run may use several cores and a round trains
# at least this many clients (two workers need two tasks) ...
MIN_CLIENTS_FOR_PROCESSES = 2
# ... through at least this many samples of local SGD: below it a round takes milliseconds,
# and starting the workers (0.1 s and up, the first pool of a process 1 to 2 s) would not pay.
# Such a round of a model the grouped executor trains is grouped in this process instead:
# digits_cnn at batch 16, 2.2x the sequential executor (docs/speed.md, 2026-11-27).
MIN_SAMPLES_FOR_PROCESSES = 2000
# With several cores, `auto` trains small models in grouped workers: each single-threaded
# worker trains its share of the round as one wider model (sim/grouped.py). Where a local step
# is at most this many training FLOPs per client (batch x forward and backward per sample).
# Measured on 2 cores, whole rounds with evaluation (docs/speed.md, 2026-11-27): against
# plain workers, cfl_convnet at batch 10 (13 MFLOP a step) 1.9x, at batch 128 (164 MFLOP)
# 1.24x; fedavg_cnn at batch 10 (724 MFLOP) plain workers win. Its sums run in another order,
# so its results equal a sequential run's to float tolerance, not bit for bit
# (`run.executor=processes` keeps them bit for bit).
MAX_STEP_FLOPS_FOR_GROUPED = 200e6
# With one core `auto` groups a round in this process where a local step is at most this many
# FLOPs. Measured against the sequential executor at one thread (docs/speed.md): 2.5-2.8x
# at 13 MFLOP (cfl_convnet at batch 10), 1.05-1.13x at 164 and 375 (cfl_convnet at batch 128,
# cnn_femnist_tiny at 20), 0.60-0.72x at 724 (fedavg_cnn at 10). Float tolerance, not bit for
# bit: the one-thread runs recorded before 2026-11-27 were sequential, and
# `run.executor=sequential` reruns them to the last digit.
MAX_STEP_FLOPS_FOR_GROUPED_ONE_CORE = 400e6
# Grouping pays only where each weight is used many times a sample (convolutions): a grouped
# step streams every client's copy of the weights through memory, where the sequential
# executor keeps one copy in cache. Forward FLOPs a sample per parameter: an MLP's Linear
# layers give 2 (one multiply-add a weight), the CNNs measured here 13-94. Measured at one
# thread (docs/speed.md, 2026-11-29), MLP 784-200-10 at batch 10 / 50 / 150: grouped
# 0.43x / 0.81x / 0.96x sequential, grouped workers 0.85x plain ones at batch 10; LeNet-5
# (12.7) 1.93x, digits_cnn (13.4) 2.2x, cfl_convnet (94) 2.5-2.8x.
MIN_FLOPS_PER_PARAMETER_FOR_GROUPED = 4.0
# A training step costs about three forward passes (forward, input and weight gradients).
TRAINING_PASSES = 3.0
# With run.threads unset, a run on a CPU computes with one torch thread in this process where
# a client's local step is at most this many FLOPs; cores are used by worker processes. Two
# threads split each small kernel and wait for each other at every layer, and on a shared
# machine spin while the other is descheduled (docs/speed.md, 2026-12-07: CFL's
# reference workload, 164 MFLOP a step, in one process at torch's 2 threads 3.8x the time of
# one thread; quickstart, 6 MFLOP, 50x). Larger steps keep torch's threads.
MAX_STEP_FLOPS_FOR_ONE_THREAD = 1e9


@dataclass(frozen=True)
class Workload:
    """What `auto` weighs: a round's clients and samples, and the cores the run may use."""

    clients_per_round: int
    samples_per_round: int      # training samples a round's local SGD goes through
    cores: int                  # usable cores, capped by the run's threads
    obstacle: str | None        # why tasks must stay in one process (module state), or None
    # Why the grouped executor cannot train the model (None: it can), and one client's
    # training FLOPs per local step.
    grouped_obstacle: str | None = "not weighed"
    step_flops: float = float("inf")
    # One sample's forward FLOPs per parameter (MIN_FLOPS_PER_PARAMETER_FOR_GROUPED).
    flops_per_parameter: float = float("inf")
    # Whether the obstacle is one the user can lift (workers could not start: the main
    # script), so that the run says so at WARNING.
    fixable: bool = False

    def groups_well(self, max_step_flops: float) -> bool:
        """Whether the grouped executor trains the model and pays at this step size."""
        return (self.grouped_obstacle is None and self.step_flops <= max_step_flops
                and self.flops_per_parameter >= MIN_FLOPS_PER_PARAMETER_FOR_GROUPED)


def resolve_device(name: str) -> torch.device:
    """'auto' -> CUDA when available, else the CPU; otherwise the named torch device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"run.device {name!r} is not a torch device (auto, cpu, cuda, "
                          f"cuda:1, ...): {err}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"run.device {name!r}: CUDA is not available here; use cpu or auto")
    return device


def auto_kind(device: torch.device, workload: Workload | None) -> tuple[str, str]:
    """`auto`'s executor and why: vectorised on CUDA; on a CPU, where the run may use several
    cores, for a round of several clients and enough samples, worker processes: grouped ones
    for a model the grouped executor trains at small local steps (MAX_STEP_FLOPS_FOR_GROUPED)
    that uses each weight several times a sample (MIN_FLOPS_PER_PARAMETER_FOR_GROUPED: CNNs,
    not MLPs), else plain ones; below MIN_SAMPLES_FOR_PROCESSES such a model grouped in this
    process; otherwise sequential. All but grouped give a one-thread sequential run's results
    bit for bit; grouped gives them to float tolerance.

    Measured (docs/speed.md, 2 cores): on a quiet machine two single-threaded workers beat
    one two-threaded process (FedAvg CNN at batch 50: 2.89 against 3.29 s a round); when other
    jobs leave the run one core's share, the two threads of one process stall each other (2.9
    to 180 times slower than two workers), while two workers cost at most 32 % over one thread.
    """
    if device.type == "cuda":
        return "vectorised", "CUDA"
    if workload is None:
        return "sequential", "CPU"
    if workload.cores < 2:
        why = "one core (usable cores, capped by run.threads or torch's threads)"
        if workload.clients_per_round >= 2 \
                and workload.groups_well(MAX_STEP_FLOPS_FOR_GROUPED_ONE_CORE):
            return "grouped", (f"{why}, {workload.clients_per_round} clients a round, local "
                               f"steps of {workload.step_flops / 1e6:.0f} MFLOP: grouped in "
                               f"this process; results equal sequential's to float tolerance "
                               f"(run.executor=sequential: bit for bit)")
        if workload.grouped_obstacle is None \
                and workload.flops_per_parameter < MIN_FLOPS_PER_PARAMETER_FOR_GROUPED:
            why += (f"; not grouped: {workload.flops_per_parameter:.1f} forward FLOPs a sample "
                    f"per parameter, too few to pay for streaming every client's weights")
        return "sequential", why
    if workload.obstacle:
        if workload.fixable and workload.clients_per_round >= 2 \
                and workload.groups_well(MAX_STEP_FLOPS_FOR_GROUPED):
            return "grouped", (f"{workload.obstacle}: grouped in this process; results equal "
                               f"sequential's to float tolerance")
        return "sequential", workload.obstacle
    if workload.clients_per_round < MIN_CLIENTS_FOR_PROCESSES:
        return "sequential", f"{workload.clients_per_round} clients a round"
    if workload.samples_per_round < MIN_SAMPLES_FOR_PROCESSES:
        if workload.groups_well(MAX_STEP_FLOPS_FOR_GROUPED):
            return "grouped", (f"{workload.clients_per_round} clients and "
                               f"{workload.samples_per_round} training samples a round: "
                               f"grouped in this process (workers would not pay); results "
                               f"equal sequential's to float tolerance")
        return "sequential", f"{workload.samples_per_round} training samples a round"
    why = (f"{workload.cores} cores, {workload.clients_per_round} clients and "
           f"{workload.samples_per_round} training samples a round")
    if workload.groups_well(MAX_STEP_FLOPS_FOR_GROUPED):
        return "grouped", (f"{why}, local steps of {workload.step_flops / 1e6:.0f} MFLOP; "
                           f"results equal sequential's to float tolerance "
                           f"(run.executor=processes: bit for bit)")
    return "processes", why


def run_threads(run: Mapping[str, Any], device: torch.device,
                workload: Workload | None) -> int | None:
    """Torch's threads in this process during the run: run.threads; unset, on a CPU, one
    where local steps are small (MAX_STEP_FLOPS_FOR_ONE_THREAD); None keeps torch's own."""
    if run.get("threads"):
        return int(run["threads"])
    if device.type == "cpu" and workload is not None \
            and workload.step_flops <= MAX_STEP_FLOPS_FOR_ONE_THREAD:
        return 1
    return None


def executor_kind(name: str, device: torch.device, workload: Workload | None = None) -> str:
    """The executor `run.executor` names; 'auto' as `auto_kind` decides."""
    if name not in EXECUTORS:
        raise ConfigError(f"unknown run.executor {name!r}; valid: {', '.join(EXECUTORS)}")
    return auto_kind(device, workload)[0] if name == "auto" else name


def workload(run: Mapping[str, Any], train: Mapping[str, Any], model: FlatModel,
             federation: Federation, threads_budget: int | None = None) -> Workload:
    """The Workload of a config's run and train sections on `federation`; `threads_budget`
    stands for torch's threads when run.threads is unset (a drift's executor is built while
    the run holds torch at its own threads)."""
    sizes = federation.train_sizes()
    k = clients_per_round(float(train["participation"]), federation.num_clients)
    mean = float(sizes.mean()) if len(sizes) else 0.0
    if train.get("local_steps"):
        per_client = float(train["local_steps"]) * min(int(train["batch_size"]), mean)
    else:
        per_client = float(train.get("local_epochs") or 1) * mean
    # The run's thread budget caps the workers: run.threads, else torch's threads (which follow
    # OMP_NUM_THREADS), so a run told to keep to one core does.
    budget = int(run["threads"]) if run.get("threads") else (
        threads_budget or torch.get_num_threads())
    batch = int(train.get("batch_size") or 1)
    grouped = grouped_obstacle(model.module)
    forward = counted_flops(model.module, tuple(federation.input_shape))
    obstacle = state_obstacle(model.module)
    started = None if obstacle else start_obstacle(model.module)
    if train.get("optimizer_state") == "kept":   # the clients' optimiser states live here
        obstacle = "train.optimizer_state=kept (each client's optimiser state is in this process)"
    return Workload(k, int(k * per_client), min(usable_cores(), budget), obstacle or started,
                    grouped, TRAINING_PASSES * forward * batch, forward / max(model.size, 1),
                    fixable=bool(started) and not obstacle)


def counted_flops(module: nn.Module, input_shape: tuple[int, ...]) -> float:
    """`forward_flops`, or infinity for a model whose forward pass on zeros fails."""
    try:
        return float(forward_flops(module, input_shape))
    except Exception:   # a user's model that needs other inputs: weighed as large
        return math.inf


def forward_flops(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    """One sample's forward FLOPs in `module`'s Linear and Conv2d layers (2 per multiply-add),
    what torch's FlopCounterMode counts for the chains the grouped executor trains.

    Counted from layer shapes by forward hooks, not by FlopCounterMode: its first use imports
    torch._dynamo, 1.5 to 3 s added to every run for a log line's estimate."""
    total = 0

    def count(layer: nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(layer, nn.Linear):
            total += 2 * layer.in_features * out.numel()
        elif isinstance(layer, nn.Conv2d):
            fan_in = layer.in_channels // layer.groups * math.prod(layer.kernel_size)
            total += 2 * fan_in * out.numel()

    hooks = [m.register_forward_hook(count) for m in module.modules()
             if isinstance(m, (nn.Linear, nn.Conv2d))]
    try:
        with torch.no_grad():
            module(torch.zeros(1, *input_shape))
    finally:
        for hook in hooks:
            hook.remove()
    return total


def step_flops(model: FlatModel, input_shape: tuple[int, ...], batch: int) -> float:
    """Training FLOPs of one local step of `batch` samples: 3 forward passes' worth."""
    return TRAINING_PASSES * forward_flops(model.module, input_shape) * batch


@dataclass(frozen=True)
class Choice:
    """What a run computes with: its device, executor and workers, and torch's threads in this
    process (None: torch's own)."""

    device: torch.device
    name: str                   # run.executor as given
    kind: str
    workers: int                # worker processes; 1: in this process
    threads: int | None
    why: str                    # `auto`'s reason ('' for a named executor)
    work: Workload | None

    def describe(self) -> str:
        """One line: the executor, its workers and threads, and why."""
        threads = self.threads or torch.get_num_threads()
        where = (f"{self.kind} in {self.workers} worker processes of 1 thread on {self.device}"
                 if self.workers > 1 else f"{self.kind} on {self.device}, {threads} thread"
                 f"{'s' if threads > 1 else ''}")
        return f"executor: {where}" + (f" (auto: {self.why})" if self.why else "")


def choose(run: Mapping[str, Any], model: FlatModel, federation: Federation,
           train: Mapping[str, Any] | None = None, threads_budget: int | None = None) -> Choice:
    """The executor, workers and threads the config's `run` section asks for. `train` (the
    config's train section) lets `auto` weigh the round's work; `threads_budget` stands for
    torch's threads where run.threads is unset (`workload`)."""
    device = resolve_device(str(run.get("device", "auto")))
    name = str(run.get("executor", "auto"))
    work = workload(run, train, model, federation, threads_budget) if train is not None else None
    kind = executor_kind(name, device, work)
    why = auto_kind(device, work)[1] if name == "auto" else ""
    if kind == "processes":
        workers = int(run.get("workers") or (work.cores if name == "auto" and work else None)
                      or (int(run["threads"]) if run.get("threads") else 0)
                      or usable_cores())
    else:
        # `auto` groups in workers unless the round is too small to start them, or they
        # cannot start (auto_kind).
        workers = int(run.get("workers") or (
            work.cores if name == "auto" and work and not work.obstacle
            and work.samples_per_round >= MIN_SAMPLES_FOR_PROCESSES else 1))
        if kind != "grouped" or device.type != "cpu":
            workers = 1
    return Choice(device, name, kind, workers, run_threads(run, device, work), why, work)


def build_executor(choice: Choice, model: FlatModel, federation: Federation, seed: int,
                   transform: ParameterTransform | None,
                   validation_fraction: float) -> Executor:
    """The executor `choice` names, on its device; its line is logged (`choice_log`), at
    WARNING where workers could have used more cores but could not start."""
    device, kind = choice.device, choice.kind
    # Batched executors' sequential fallbacks: expected where `auto` picked them.
    notice_level = logging.INFO if choice.name == "auto" else logging.WARNING
    work = choice.work
    if choice.name == "auto" and work is not None and work.fixable and work.cores > 1:
        choice_log.warning("%s; this run uses one of %d cores: put the script's run under "
                           "`if __name__ == \"__main__\":` (or define the model in a module) "
                           "to train in worker processes", choice.describe(), work.cores)
    else:
        choice_log.info("%s", choice.describe())
    if kind == "processes":
        if device.type != "cpu":
            raise ConfigError(f"run.executor=processes runs on the CPU; run.device is {device}")
        return ProcessExecutor(model, federation, seed, transform, validation_fraction,
                               choice.workers)
    if kind == "grouped" and choice.workers > 1:
        return ProcessExecutor(model, federation, seed, transform, validation_fraction,
                               choice.workers, grouped=True, notice_level=notice_level)
    if kind == "vectorised":
        return VectorisedExecutor(model, federation, seed, transform, validation_fraction,
                                  device, notice_level=notice_level)
    if kind == "grouped":
        return GroupedExecutor(model, federation, seed, transform, validation_fraction, device,
                               notice_level=notice_level)
    return SequentialExecutor(model, federation, seed, transform, validation_fraction, device)
