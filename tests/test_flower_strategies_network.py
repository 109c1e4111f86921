"""clusterfed's strategies in a user's Flower app, run by `flwr run`: on Flower's simulation
engine (Ray) and on real SuperNodes on 127.0.0.1.

The app is Flower's PyTorch quickstart with its strategy line changed (`userapp/server_app.py`
below) and the template-style ClientApp of `flower_template`; the ServerApp writes the clusters
by node id, and a Flower mod on the ClientApp records which partition each node serves (the
test's only instrument: the handlers are the template's, unchanged).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: the Flower runtime tests need "
                    "pip install -c constraints.txt -e '.[test,flower]'")

import flower_template as template  # noqa: E402
from flower_control import strategy_line  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402

from clusterfed.flower.local import LocalFederation  # noqa: E402

pytestmark = pytest.mark.flower

CLIENTS = 8
RUN_TIMEOUT = 900.0

PYPROJECT = '''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "userapp"
version = "1.0.0"
license = "Apache-2.0"
dependencies = ["clusterfed[flower]"]

[tool.flwr.app]
publisher = "tests"

[tool.flwr.app.components]
serverapp = "userapp.server_app:app"
clientapp = "userapp.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 3
fraction-train = 1.0
local-epochs = 1
lr = 0.05
out-dir = ""
'''

# Flower's PyTorch quickstart ServerApp; only the strategy line differs (and what is saved).
SERVER_APP = '''"""userapp: A Flower / PyTorch app."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from flwr.serverapp.strategy import FedAvg  # noqa: F401
from clusterfed.flower.strategies import CFL, FLHC, IFCA  # noqa: F401
from userapp.task import Net

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    fraction_train: float = context.run_config["fraction-train"]
    num_rounds: int = context.run_config["num-server-rounds"]
    lr: float = context.run_config["lr"]

    # Load global model
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize FedAvg strategy
    strategy = STRATEGY

    # Start strategy, run FedAvg for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
    )

    # Save final model to disk
    out = Path(context.run_config["out-dir"])
    torch.save(result.arrays.to_torch_state_dict(), out / "final_model.pt")
    # Each node's cluster (FedAvg, the tests' control, has one cluster)
    assignment = getattr(result, "assignment", None) or dict.fromkeys(grid.get_node_ids(), 0)
    clusters = {str(node): k for node, k in assignment.items()}
    (out / "clusters.json").write_text(json.dumps(clusters))
'''

# The template's handlers, registered on a ClientApp with one mod that records the partition.
CLIENT_APP = '''"""userapp: the template ClientApp (userapp.task), with a recording mod."""

from pathlib import Path

from flwr.clientapp import ClientApp

from userapp import task


def record_partition(msg, context, call_next):
    folder = Path(context.run_config["out-dir"]) / "nodes"
    folder.mkdir(exist_ok=True)
    (folder / str(context.node_id)).write_text(str(context.node_config["partition-id"]))
    return call_next(msg, context)


app = ClientApp(mods=[record_partition])
app.train()(task.train_handler)
app.evaluate()(task.evaluate_handler)
'''


def write_user_app(folder: Path, strategy: str) -> None:
    """The user's app folder (replacing what LocalFederation wrote there)."""
    shutil.rmtree(folder, ignore_errors=True)
    package = folder / "userapp"
    package.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text("")
    shutil.copy(Path(template.__file__), package / "task.py")
    (package / "server_app.py").write_text(SERVER_APP.replace("STRATEGY", strategy))
    (package / "client_app.py").write_text(CLIENT_APP)


def started(workdir: Path, simulation: bool):
    return LocalFederation(CLIENTS, workdir, simulation=simulation,
                           echo=lambda line: None).start()


@pytest.fixture(scope="module")
def simulation_engine(tmp_path_factory):
    pytest.importorskip("ray", reason="Flower's simulation engine needs the simulation extra: "
                        "pip install -c constraints.txt -e '.[flower,simulation]'")
    federation = started(tmp_path_factory.mktemp("flower-simulation"), simulation=True)
    yield federation
    federation.stop()


@pytest.fixture(scope="module")
def supernodes(tmp_path_factory):
    federation = started(tmp_path_factory.mktemp("flower-supernodes"), simulation=False)
    yield federation
    federation.stop()


def run_user_app(federation: LocalFederation, out: Path, strategy: str, rounds: int) -> float:
    """Run the app with `strategy`; the ARI of its clusters against the true groups."""
    out.mkdir(parents=True)
    write_user_app(federation.app_dir, strategy)
    code = federation.submit({"num-server-rounds": rounds, "out-dir": str(out)},
                             timeout=RUN_TIMEOUT, on_line=lambda line: None)
    logs = "\n".join(p.tail() for p in federation.processes.values())
    assert code == 0 and (out / "clusters.json").exists(), logs
    clusters = {int(k): v for k, v in json.loads((out / "clusters.json").read_text()).items()}
    partition = {int(p.name): int(p.read_text()) for p in (out / "nodes").iterdir()}
    nodes = sorted(clusters)
    assert sorted(partition[n] for n in nodes) == list(range(CLIENTS))
    return adjusted_rand_score([template.true_group(partition[n]) for n in nodes],
                               [clusters[n] for n in nodes])


# The fewest rounds and options that found the four groups in process (the template app on a
# LoopbackGrid) from each of ten initial models, plus a margin: each exchange with SuperNodes
# costs seconds of polling (docs/flower-strategies.md, "How these tests were checked"). CFL
# splits all four by round 8 (round 30 with its defaults); FL+HC and IFCA cluster after 5
# rounds (after 3, one model in ten merged two groups). CFL and FL+HC skip the per-round
# evaluation; IFCA keeps it, so that path crosses the network too.
CASES = [
    ("CFL", "CFL(min_available_nodes=8, fraction_evaluate=0.0, split_into='groups', rho=0.7, "
            "stagnation_window=1, similarity_memory=2)", 10),
    ("FLHC", "FLHC(min_available_nodes=8, fraction_evaluate=0.0, rounds_before_clustering=5)",
     6),
    ("IFCA", "IFCA(min_available_nodes=8, select_round=5)", 7),
]


@pytest.mark.parametrize(("line", "rounds"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_simulation_engine_runs_a_users_app_with_a_clustered_strategy(
        simulation_engine, line, rounds, tmp_path):
    ari = run_user_app(simulation_engine, tmp_path / "out", strategy_line(line, CLIENTS), rounds)
    assert ari >= 0.95


@pytest.mark.parametrize(("line", "rounds"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_supernodes_run_a_users_app_with_a_clustered_strategy(supernodes, line, rounds,
                                                              tmp_path):
    ari = run_user_app(supernodes, tmp_path / "out", strategy_line(line, CLIENTS), rounds)
    assert ari >= 0.95
