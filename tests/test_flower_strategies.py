"""clusterfed's methods as Flower strategies (`clusterfed.flower.strategies`), in process.

A loopback Grid calls a ClientApp's handlers in this process: the Flower template-style app of
`flower_template` (Flower's message convention only, no clusterfed code), which the strategies
must cluster, and a ClientApp in the same convention that trains with clusterfed's own client
code, with which a strategy must give the simulator's clusters exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed: the Flower strategy tests need "
                    "pip install -c constraints.txt -e '.[test,flower]'")

import flower_template as template  # noqa: E402
import torch  # noqa: E402
from flower_cases import flower_config  # noqa: E402
from flower_control import assignment, under_test  # noqa: E402
from flower_grid import LoopbackGrid  # noqa: E402
from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402

from clusterfed.algorithms.base import build_algorithm  # noqa: E402
from clusterfed.errors import ClusterfedError  # noqa: E402
from clusterfed.flower import strategies  # noqa: E402
from clusterfed.flower.arrays import Layout, flatten, layout_of, unflatten  # noqa: E402
from clusterfed.flower.node import node_for  # noqa: E402
from clusterfed.flower.queries import (  # noqa: E402
    SIGNATURE,
    inputs_and_labels,
    signature_query,
)
from clusterfed.flower.wire import (  # noqa: E402
    config_json,
    decode_task,
    encode_result,
)
from clusterfed.sim.build import build_run  # noqa: E402
from clusterfed.sim.simulation import run_config  # noqa: E402
from clusterfed.tasks import ClientTask, TaskKind  # noqa: E402

CLIENTS = 8
# Each method's strategy with its defaults, and the rounds its toy-mixture claim runs.
CLAIMS = [("CFL", 30), ("FLHC", 12), ("IFCA", 14)]


def template_grid(groups: int = template.GROUPS, app: ClientApp = template.app,
                  shift: str = "swap") -> LoopbackGrid:
    return LoopbackGrid(range(CLIENTS), app=app, run_config={"local-epochs": 1},
                        node_config={"num-partitions": CLIENTS, "groups": groups,
                                     "shift": shift})


def quickstart(strategy: strategies.ClusteredStrategy, grid: LoopbackGrid, rounds: int
               ) -> strategies.ClusteredResult:
    """Flower's PyTorch quickstart ServerApp body with `strategy` in FedAvg's place."""
    torch.manual_seed(0)
    arrays = ArrayRecord(template.Net().state_dict())
    return under_test(strategy, len(grid.nodes)).start(
        grid=grid, initial_arrays=arrays, train_config=ConfigRecord({"lr": 0.05}),
        num_rounds=rounds)


def found_and_truth(result: strategies.ClusteredResult, grid: LoopbackGrid, groups: int
                    ) -> tuple[list[int], list[int]]:
    nodes = sorted(grid.nodes)    # the strategies' clients: the sorted node ids
    return (assignment(result, nodes),
            [template.true_group(grid.nodes[node], groups) for node in nodes])


@pytest.mark.parametrize(("name", "rounds"), CLAIMS)
def test_a_template_client_app_unmodified_gets_the_four_label_swap_clusters(name, rounds):
    grid = template_grid()
    result = quickstart(getattr(strategies, name)(min_available_nodes=CLIENTS), grid, rounds)
    found, truth = found_and_truth(result, grid, template.GROUPS)
    assert adjusted_rand_score(truth, found) >= 0.95, (found, truth)
    # Flower's Result as FedAvg.start fills it, from the template's own metrics.
    assert set(result.evaluate_metrics_clientapp) == set(range(1, rounds + 1))
    assert result.evaluate_metrics_clientapp[rounds]["eval_acc"] > 0.8
    assert "train_loss" in result.train_metrics_clientapp[rounds]
    assert len(result.cluster_arrays) == 4
    assert list(result.arrays.keys()) == list(template.Net().state_dict())


@pytest.mark.parametrize(("name", "rounds"), CLAIMS)
def test_an_iid_federation_stays_one_cluster(name, rounds):
    grid = template_grid(groups=1)
    result = quickstart(getattr(strategies, name)(min_available_nodes=CLIENTS), grid, rounds)
    assert set(found_and_truth(result, grid, 1)[0]) == {0}


def template_app_with_signatures() -> ClientApp:
    """The template's ClientApp plus the one line PACFL asks of a user: the signature query,
    built from the template's own training loader."""
    app = ClientApp()
    app.train()(template.train_handler)
    app.evaluate()(template.evaluate_handler)
    app.query(SIGNATURE)(signature_query(lambda context: template.partition_data(context)[0]))
    return app


@pytest.mark.parametrize(("groups", "shift"), [(template.GROUPS, "labels"), (1, "labels")],
                         ids=["label-groups", "iid"])
def test_pacfl_clusters_label_groups_from_the_signatures_of_a_template_client_app(groups,
                                                                                  shift):
    grid = template_grid(groups, template_app_with_signatures(), shift)
    result = quickstart(strategies.PACFL(min_available_nodes=CLIENTS), grid, 2)
    found, truth = found_and_truth(result, grid, groups)
    if groups > 1:
        assert adjusted_rand_score(truth, found) >= 0.95, (found, truth)
    else:
        assert set(found) == {0}, found
    assert set(result.evaluate_metrics_clientapp) == {1, 2}


# A ClientApp in Flower's convention whose work is clusterfed's client code, so that the
# strategy and the simulator do the same arithmetic: the same batches, the same SGD, and IFCA's
# losses on the training data (the `clusterfed-task` extra says a message asks for them).

def clusterfed_app(config: dict, layout: Layout) -> ClientApp:
    text = config_json(config)
    spec = build_run(config).spec
    app = ClientApp()

    def reply(msg: Message, arrays: ArrayRecord | None, metrics: dict) -> Message:
        content = RecordDict({"metrics": MetricRecord(metrics)})
        if arrays is not None:
            content["arrays"] = arrays
        return Message(content, reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        node = node_for(text, context.node_config)
        params = flatten(msg.content["arrays"], layout)
        run = msg.content["config"]
        r = int(run["server-round"]) - 1
        task = ClientTask(node.index, TaskKind.TRAIN, params,
                          spec.decayed(float(config["train"]["lr_decay"]), r), id=0)
        result = node.run(task, r, int(run.get("clusterfed-step", 0)))
        return reply(msg, unflatten(params + result.update, layout),
                     {"train_loss": result.loss, "num-examples": result.num_samples})

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        node = node_for(text, context.node_config)
        params = flatten(msg.content["arrays"], layout)
        run = msg.content["config"]
        r = int(run["server-round"]) - 1
        if run.get("clusterfed-task") == "losses":
            task = ClientTask(node.index, TaskKind.LOSSES, params[None], id=0)
            result = node.run(task, r, int(run.get("clusterfed-step", 0)))
            return reply(msg, None, {"eval_loss": float(result.losses[0]),
                                     "num-examples": result.num_samples})
        result = node.run(ClientTask(node.index, TaskKind.EVALUATE, params, id=0), r, 0)
        return reply(msg, None, {"eval_loss": float(result.losses[0]),
                                 "eval_acc": float(result.accuracies[0]),
                                 "num-examples": result.num_samples})

    @app.query(SIGNATURE)
    def signature(msg: Message, context: Context) -> Message:
        task, r, step, _ = decode_task(msg.content)
        return Message(encode_result(node_for(text, context.node_config).run(task, r, step)),
                       reply_to=msg)

    return app


SAME_ARITHMETIC = [
    ({"name": "cfl", "acceptance": "fixed", "eps1": 0.6, "eps2": 0.1}, 2),
    ({"name": "flhc", "rounds_before_clustering": 1, "threshold_mode": "clusters",
      "threshold": 2}, 2),
    # Selection, then a round of losses; a low silhouette bar so that 4 clients split.
    ({"name": "ifca", "select_round": 1, "min_silhouette": 0.05}, 3),
    ({"name": "fesem", "k": 2, "select_round": 1, "initialisation": "clients"}, 2),
    ({"name": "flexcfl", "k": 2, "warmup_rounds": 0}, 2),
    # Signatures of a label swap hardly differ: two clusters asked for, the cut is arithmetic.
    ({"name": "pacfl", "n_clusters": 2}, 2),
]


@pytest.mark.parametrize(("algorithm", "rounds"), SAME_ARITHMETIC,
                         ids=[a["name"] for a, _ in SAME_ARITHMETIC])
def test_a_strategy_gives_the_simulators_clusters_on_the_same_federation_and_seed(algorithm,
                                                                                   rounds):
    config = flower_config(algorithm, rounds=rounds)
    expected = run_config(config)["clustering"]["assignment"]
    built = build_run(config)
    flat = built.model
    layout = Layout(tuple((name, tuple(shape), "float32")
                          for name, shape in zip(flat.names, flat.shapes, strict=True)))
    n = int(config["scenario"]["clients"])
    grid = LoopbackGrid(range(n), app=clusterfed_app(config, layout),
                        node_config={"num-partitions": n})
    options = {k: v for k, v in algorithm.items() if k != "name"}
    strategy = under_test(strategies.STRATEGIES[algorithm["name"]](
        min_available_nodes=n, fraction_train=float(config["train"]["participation"]),
        seed=int(config["seed"]), **options), n)
    initial = unflatten(built.setup.initial_params, layout)
    result = strategy.start(grid=grid, initial_arrays=initial,
                            train_config=ConfigRecord({"lr": float(config["train"]["lr"])}),
                            num_rounds=rounds, evaluate_fn=first_weight)
    # Node ids rise with the partition: client c is partition c, as in the simulator.
    nodes = sorted(grid.nodes)
    assert [grid.nodes[node] for node in nodes] == list(range(n))
    assert assignment(result, nodes) == expected
    assert len(set(expected)) > 1    # the case clusters at all
    # evaluate_fn saw every cluster's model, before round 1 the initial one.
    assert result.evaluate_metrics_serverapp[0]["w"] == [first_weight(0, initial)["w"]]
    assert result.evaluate_metrics_serverapp[rounds]["w"] == [
        first_weight(rounds, model)["w"] for model in result.cluster_arrays]


def first_weight(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """A server-side 'evaluation': the model's first weight."""
    return MetricRecord({"w": float(next(iter(arrays.values())).numpy().ravel()[0])})


def test_a_method_whose_clients_must_send_more_is_refused_in_one_line():
    strategy = strategies.ClusteredStrategy(
        build_algorithm({"name": "cfl", "similarity_from": "gradients"}),
        min_available_nodes=CLIENTS)
    with pytest.raises(ClusterfedError, match="gradient task, which Flower's train and "
                       "evaluate replies cannot answer"):
        quickstart(strategy, template_grid(), 1)


def test_an_unknown_option_is_refused_in_one_line():
    with pytest.raises(ClusterfedError, match="CFL: .*bogus"):
        strategies.CFL(bogus=1)


def test_a_record_survives_flattening_with_its_names_shapes_and_dtypes():
    record = ArrayRecord({"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3)),
                          "steps": Array(np.array(7, dtype=np.int64))})
    layout = layout_of(record)
    vector = flatten(record, layout)
    np.testing.assert_array_equal(vector, [0, 1, 2, 3, 4, 5, 7])
    back = unflatten(vector, layout)
    assert list(back.keys()) == ["w", "steps"]
    assert back["steps"].numpy().dtype == np.int64 and back["steps"].numpy() == 7
    np.testing.assert_array_equal(back["w"].numpy(), record["w"].numpy())
    with pytest.raises(ValueError, match="expected the model's"):
        flatten(ArrayRecord({"v": Array(np.zeros(3, np.float32))}), layout)


def test_the_signature_query_reads_pair_and_mapping_batches_alike():
    x, y = torch.arange(12.0).reshape(6, 2), torch.tensor([0, 1, 0, 1, 2, 2])
    pairs = [(x[:4], y[:4]), (x[4:], y[4:])]
    mappings = [{"image": x[:4], "label": y[:4]}, {"image": x[4:], "label": y[4:]}]
    for got in (inputs_and_labels(pairs), inputs_and_labels(mappings, input_key="image")):
        torch.testing.assert_close(got, (x, y))
    with pytest.raises(ValueError, match="yielded no batch"):
        inputs_and_labels([])
    with pytest.raises(ValueError, match="a batch is \\(inputs, labels\\)"):
        inputs_and_labels([x])
