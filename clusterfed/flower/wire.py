"""ClientTask / ClientResult <-> Flower records: the one adapter between the seam and the wire.

Nothing here knows an algorithm or a task kind: the kind travels by its value, `meta` as a
ConfigRecord of its own, every array field of the records in an ArrayRecord under the field's
name (1-D or 2-D, any dtype), every scalar field by its name (the task id and its result's
`task_id` included) and every typed per-kind record (TrainSpec, LocalObjective, LossSpec,
SignatureSpec) as a record of its own. A task kind, a field or a per-kind record added to
`clusterfed.tasks` travels without a change here.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from clusterfed.tasks import ClientResult, ClientTask, TaskKind

# Message types: `<category>.<action>` routes to the ClientApp function of that name.
HELLO = "query.hello"        # which client do you serve, and what do you hold?
INITIAL = "query.initial"    # the initial model (draw i) in the clients' P-space (privacy)
TASK = "train.task"          # run one ClientTask (any kind, EVALUATE included)

ARRAYS, FIELDS, META, TRAIN, METRICS, RUN = "arrays", "fields", "meta", "train", "metrics", "run"


def _plain(value: Any) -> Any:
    """numpy scalars -> Python scalars and tuples -> lists, which Flower's records accept."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def _split_fields(obj: Any, nested: Mapping[str, Any]) -> tuple[dict[str, np.ndarray],
                                                                dict[str, Any]]:
    """A record's array fields and its scalar fields (enums by value; None left out)."""
    arrays, scalars = {}, {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name in nested or value is None:
            continue
        if isinstance(value, np.ndarray):
            arrays[f.name] = np.ascontiguousarray(value)
        elif isinstance(value, Enum):
            scalars[f.name] = value.value
        else:
            scalars[f.name] = _plain(value)
    return arrays, scalars


def _array_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(a) for name, a in arrays.items()})


def _meta_record(meta: Mapping[str, Any]) -> ConfigRecord:
    return ConfigRecord({str(k): _plain(v) for k, v in meta.items()})


def _nested_records() -> dict[str, type]:
    """ClientTask's fields that hold a record of their own (TrainSpec, LocalObjective, ...)."""
    nested = {}
    for name, hint in typing.get_type_hints(ClientTask).items():
        for kind in typing.get_args(hint) or (hint,):
            if dataclasses.is_dataclass(kind):
                nested[name] = kind
    return nested


NESTED = _nested_records()


def _run_record(config_json: str, partition: int | None, **more: int) -> ConfigRecord:
    """The run's config, and the partition the message is meant for when the server says."""
    fields: dict[str, Any] = {**more, "config": config_json}
    if partition is not None:
        fields["partition"] = int(partition)
    return ConfigRecord(fields)


def addressed_partition(content: RecordDict) -> int | None:
    """The partition a task or evaluation is meant for (None: its client is the partition)."""
    value = content.config_records[RUN].get("partition")
    return None if value is None else int(value)


def encode_task(task: ClientTask, round_index: int, step: int, config_json: str,
                partition: int | None = None) -> RecordDict:
    """One task, with the (round, step) that seeds its batch order and the run's config.

    `partition`: the node the server means, when its client id (the task's, which seeds the
    generator) is not its partition, because a node that did not fit was refused.
    """
    arrays, scalars = _split_fields(task, nested={*NESTED, "meta"})
    content = RecordDict({
        ARRAYS: _array_record(arrays),
        FIELDS: ConfigRecord(scalars),
        META: _meta_record(task.meta),
        RUN: _run_record(config_json, partition, round=round_index, step=step),
    })
    for name in NESTED:
        value = getattr(task, name)
        if value is None:
            continue
        # Every field that is set; an absent one is None (epochs=None with steps=K).
        inner_arrays, inner_scalars = _split_fields(value, nested={})
        content[name] = ConfigRecord(inner_scalars)
        if inner_arrays:
            content[f"{name}_arrays"] = _array_record(inner_arrays)
    return content


def _scalars_for(cls: type, record: ConfigRecord | MetricRecord, skip: set[str]
                 ) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)} - skip
    return {k: v for k, v in record.items() if k in names}


def decode_task(content: RecordDict) -> tuple[ClientTask, int, int, str]:
    """The inverse of `encode_task`: (task, round, step, config JSON)."""
    fields = dict(content.config_records[FIELDS])
    arrays = {k: a.numpy() for k, a in content.array_records[ARRAYS].items()}
    nested: dict[str, Any] = {}
    for name, kind in NESTED.items():
        if name not in content.config_records:
            continue
        given: dict[str, Any] = dict(content.config_records[name])
        if f"{name}_arrays" in content.array_records:
            given.update({k: a.numpy() for k, a in content.array_records[f"{name}_arrays"].items()})
        nested[name] = kind(**{f.name: given.get(f.name) for f in dataclasses.fields(kind)})
    task = ClientTask(**{**_scalars_for(ClientTask, content.config_records[FIELDS], {"kind"}),
                         **arrays, **nested, "kind": TaskKind(fields["kind"]),
                         "meta": dict(content.config_records[META])})
    run = content.config_records[RUN]
    return task, int(run["round"]), int(run["step"]), str(run["config"])


def encode_result(result: ClientResult) -> RecordDict:
    """Arrays (update, per-model losses and accuracies, ...) as an ArrayRecord; counts and
    scalar losses as a MetricRecord; the client, kind and meta as ConfigRecords."""
    arrays, scalars = _split_fields(result, nested={"meta"})
    numbers = {k: v for k, v in scalars.items()
               if isinstance(v, int | float) and not isinstance(v, bool) and k != "client"}
    identity = {k: v for k, v in scalars.items() if k not in numbers}
    return RecordDict({
        ARRAYS: _array_record(arrays),
        METRICS: MetricRecord(numbers),
        FIELDS: ConfigRecord(identity),
        META: _meta_record(result.meta),
    })


def decode_result(content: RecordDict) -> ClientResult:
    fields = dict(content.config_records[FIELDS])
    arrays = {k: a.numpy() for k, a in content.array_records[ARRAYS].items()}
    known = {f.name for f in dataclasses.fields(ClientResult)}
    unknown = (set(arrays) | set(content.metric_records[METRICS]) | set(fields)) - known
    if unknown:
        raise ValueError(f"reply carries fields this server does not know: {sorted(unknown)}")
    return ClientResult(**{
        **_scalars_for(ClientResult, content.config_records[FIELDS], {"kind"}),
        **_scalars_for(ClientResult, content.metric_records[METRICS], set()),
        **arrays, "kind": TaskKind(fields["kind"]), "meta": dict(content.config_records[META])})


def expected_shapes(task: ClientTask, num_samples: int = 0) -> dict[str, tuple[int, ...]]:
    """The shapes a correct result of `task` has, for the kinds whose shapes are known.

    An update or gradient has the model's size; per-model losses and accuracies one entry per
    model row of `params` (per-sample losses: one row per model, one column per training
    sample the result counts; a mixture evaluation: one figure, the mixture's). Kinds not
    listed here are checked for finiteness only.
    """
    models = task.params.shape[0] if task.params.ndim == 2 else 1
    size = (task.params.shape[-1],)
    if task.kind in (TaskKind.TRAIN, TaskKind.GRADIENT):
        return {"update": size}
    if task.kind is TaskKind.LOSSES and task.loss is not None and task.loss.per_sample:
        return {"losses": (models, num_samples),
                **({"labels": (num_samples,)} if task.loss.labels else {})}
    if task.kind is TaskKind.LOSSES:
        return {"losses": (models,)}
    if task.kind is TaskKind.EVALUATE and task.mixture is not None:   # the mixture's figures
        return {"losses": (1,), "accuracies": (1,)}
    if task.kind is TaskKind.EVALUATE:
        return {"losses": (models,), "accuracies": (models,)}
    return {}


def check_result(task: ClientTask, result: ClientResult) -> str | None:
    """Why `result` is not an acceptable answer to `task`, or None when it is."""
    if result.task_id != task.id:
        return f"answers task {result.task_id}, not task {task.id}"
    if result.client != task.client or result.kind is not task.kind:
        return (f"answers client {result.client} {result.kind.value}, "
                f"not client {task.client} {task.kind.value}")
    for name, shape in expected_shapes(task, result.num_samples).items():
        value = getattr(result, name)
        if value is None or tuple(np.shape(value)) != shape:
            got = None if value is None else tuple(np.shape(value))
            return f"wrong shape: {name} {got}, expected {shape}"
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" \
                and not np.isfinite(value).all():
            return f"{f.name} holds NaN or Inf"
    if not result.is_finite():
        return "non-finite values"
    return None


# Evaluation and discovery ------------------------------------------------------------------

def encode_hello(config_json: str) -> RecordDict:
    return RecordDict({RUN: ConfigRecord({"config": config_json})})


def encode_initial(index: int, config_json: str) -> RecordDict:
    return RecordDict({RUN: _run_record(config_json, None, index=int(index))})


def decode_initial(content: RecordDict) -> tuple[int, str]:
    run = content.config_records[RUN]
    return int(run["index"]), str(run["config"])


def encode_vector(vector: np.ndarray) -> RecordDict:
    return RecordDict({ARRAYS: _array_record({"params": np.ascontiguousarray(vector)})})


def decode_vector(content: RecordDict) -> np.ndarray:
    return content.array_records[ARRAYS]["params"].numpy()


def config_json(config: Mapping[str, Any]) -> str:
    """The resolved config as the text every message carries (sorted, so it hashes stably)."""
    return json.dumps(config, sort_keys=True)


# Where a node keeps its client's optimiser state between tasks (train.optimizer_state=kept):
# Flower's context.state, which the SuperNode holds for the run, whatever process runs the app.
OPTIMIZER_STATE = "clusterfed.optimizer_state"


def read_optimizer_state(state: RecordDict) -> dict[str, np.ndarray]:
    """The optimiser-state arrays a node's context.state holds ({} before the first task)."""
    if OPTIMIZER_STATE not in state.array_records:
        return {}
    return {k: a.numpy() for k, a in state.array_records[OPTIMIZER_STATE].items()}


def write_optimizer_state(state: RecordDict, arrays: Mapping[str, np.ndarray]) -> None:
    state[OPTIMIZER_STATE] = _array_record(arrays)
