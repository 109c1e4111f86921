"""The cheap per-message mode without processes: the command lines `clusterfed flower local`
builds for each ClientApp isolation mode, the long-lived ClientApp worker's task protocol and
polling (Flower's Runtime API calls replaced by fakes), and the message-cost mod."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

pytest.importorskip("flwr", reason="Flower is not installed: the Flower runtime tests need "
                    "pip install -c constraints.txt -e '.[test,flower]'")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.common.constant import ErrorCode, SubStatus  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from helpers import cli  # noqa: E402

from clusterfed.errors import ClusterfedError  # noqa: E402
from clusterfed.flower import cost, worker  # noqa: E402
from clusterfed.flower.local import LocalFederation, worker_argv  # noqa: E402

# Command lines ----------------------------------------------------------------------------------


def federation(tmp_path: Path, **kw) -> LocalFederation:
    fed = LocalFederation(3, tmp_path, **kw)
    fed.port = 9093
    return fed


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_supernodes_run_their_clientapp_in_a_worker_by_default(tmp_path):
    argv = federation(tmp_path).node_argv(1, runtime_port=9200)
    assert option(argv, "--isolation") == "process"
    assert (option(argv, "--host"), option(argv, "--port")) == ("127.0.0.1", "9200")
    assert option(argv, "--node-config") == "partition-id=1 num-partitions=3"


def test_the_subprocess_mode_is_flowers_own(tmp_path):
    argv = federation(tmp_path, isolation="subprocess").node_argv(0)
    assert option(argv, "--isolation") == "subprocess"
    assert int(option(argv, "--port")) > 0          # a free port when none is given


def test_an_unknown_isolation_mode_is_refused(tmp_path):
    with pytest.raises(ClusterfedError, match="isolation 'thread'"):
        LocalFederation(2, tmp_path, isolation="thread")


def test_the_worker_command_names_its_supernodes_runtime_api_and_parent():
    argv = worker_argv("127.0.0.1:9200", parent_pid=42)
    assert argv[1:3] == ["-m", "clusterfed.flower.worker"]
    assert option(argv, "--runtime-api-address") == "127.0.0.1:9200"
    assert "--insecure" in argv and option(argv, "--parent-pid") == "42"
    tls = worker_argv("node.example.org:9200", root_certificates="/certs/ca.crt")
    assert "--insecure" not in tls and option(tls, "--root-certificates") == "/certs/ca.crt"
    assert "--parent-pid" not in tls
    # The command line parses as the worker's own.
    args = worker.parser().parse_args(argv[3:])
    assert (args.runtime_api_address, args.insecure, args.parent_pid) == (
        "127.0.0.1:9200", True, 42)


def test_with_secure_the_workers_sign_their_claims_with_a_secret_of_the_run(tmp_path):
    fed = federation(tmp_path, secure=True)
    fed.node_keys = [(tmp_path / f"supernode-{k}", tmp_path / f"supernode-{k}.pub")
                     for k in range(3)]
    secret = Path(option(fed.node_argv(2), "--superexec-auth-secret-file"))
    assert secret == fed.superexec_secret and len(secret.read_bytes()) == 32
    assert secret.stat().st_mode & 0o077 == 0        # the run's owner only
    argv = worker_argv("127.0.0.1:9200", secret_file=secret)
    assert option(argv, "--superexec-auth-secret-file") == str(secret)
    assert worker.parser().parse_args(argv[3:]).superexec_auth_secret_file == str(secret)
    # Flower's own per-message processes get no secret (the SuperNode ignores it there).
    plain = federation(tmp_path / "sub", secure=True, isolation="subprocess")
    plain.node_keys = fed.node_keys
    assert "--superexec-auth-secret-file" not in plain.node_argv(0)


def test_the_cli_offers_both_modes_and_the_worker(capsys):
    code, out, _ = cli(capsys, "flower", "local", "--help")
    assert code == 0 and "--isolation [process|subprocess]" in out
    code, out, _ = cli(capsys, "flower", "worker", "--help")
    assert code == 0 and "--runtime-api-address" in out


# The worker ------------------------------------------------------------------------------------


class FakeRuntime:
    """Flower's per-task Runtime API calls, as the worker module uses them."""

    def __init__(self, monkeypatch, apps: dict[str, object]) -> None:
        self.pushed: list[Message] = []
        self.outputs: list[tuple[str, str]] = []
        self.installed: list[bytes] = []
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.message = Message(RecordDict(), 7, "train.task")
        self.fab = SimpleNamespace(hash_str="abc", content=b"fab")
        self.context = Context(run_id=1, node_id=7, node_config={"partition-id": 0},
                               state=RecordDict(), run_config={})
        run = SimpleNamespace(fab_id="clusterfed/clusterfed-flower", fab_version="0.1.0")
        monkeypatch.setattr(worker, "pull_task_input",
                            lambda client: (self.message, self.context, run, self.fab))
        monkeypatch.setattr(worker, "push_message",
                            lambda client, reply, context: self.pushed.append(reply))
        monkeypatch.setattr(worker, "push_task_output",
                            lambda client, context, sub_status, details:
                            self.outputs.append((sub_status, details)))
        monkeypatch.setattr(worker, "install_from_fab",
                            lambda content, skip_prompt: self.installed.append(content))
        monkeypatch.setattr(worker, "get_load_client_app_fn",
                            lambda **kw: lambda fab_id, version, fab_hash: apps[fab_hash])


def test_the_worker_runs_each_task_and_loads_its_app_once(monkeypatch):
    calls = []

    def app(message, context):
        calls.append(context.node_config["partition-id"])
        return Message(RecordDict(), reply_to=message)

    fake = FakeRuntime(monkeypatch, {"abc": app})
    w = worker.Worker("127.0.0.1:1", insecure=True)
    assert w.run_task("token-1") and w.run_task("token-2")
    assert calls == [0, 0] and len(fake.pushed) == 2
    assert fake.outputs == [(SubStatus.COMPLETED, "")] * 2
    assert fake.installed == [b"fab"]                # installed and imported once per FAB
    assert w.tasks == 2
    w.close()


def test_an_app_error_is_the_tasks_error_reply_and_the_worker_goes_on(monkeypatch):
    def app(message, context):
        raise ValueError("no data for partition 9")

    fake = FakeRuntime(monkeypatch, {"abc": app})
    w = worker.Worker("127.0.0.1:1", insecure=True)
    assert not w.run_task("token-1")
    (reply,) = fake.pushed
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert "no data for partition 9" in reply.error.reason
    (status, details), = fake.outputs
    assert status == SubStatus.FAILED and "no data for partition 9" in details
    # A failure to pull the task still ends it, with no reply.
    monkeypatch.setattr(worker, "pull_task_input", lambda client: 1 / 0)
    assert not w.run_task("token-2")
    assert len(fake.pushed) == 1 and fake.outputs[-1][0] == SubStatus.FAILED
    w.close()


def test_the_worker_polls_fast_after_a_task_and_backs_off_when_idle(monkeypatch):
    w = worker.Worker("127.0.0.1:1", insecure=True)
    claims = iter(["t1", None, None, None, None, None, None, "t2", None])
    ran, slept = [], []

    def claim():
        token = next(claims)
        if token == "t2":
            raise httpx.ConnectError("refused")      # the node restarting: wait, go on
        return token

    monkeypatch.setattr(w, "claim", claim)
    monkeypatch.setattr(w, "run_task", ran.append)
    w.serve(stop=lambda: len(slept) == 8, sleep=slept.append)
    assert ran == ["t1"]
    assert slept[:6] == [0.05, 0.1, 0.2, 0.4, 0.8, worker.POLL_MAX]
    assert slept[6] == worker.POLL_MAX               # after the refused claim
    w.close()


# The cost log ----------------------------------------------------------------------------------


def test_the_cost_mod_logs_each_message_only_when_asked(tmp_path, monkeypatch):
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    msg = Message(RecordDict(), 3, "evaluate.model", group_id="2")
    context = Context(run_id=1, node_id=3, node_config={}, state=RecordDict(), run_config={})

    def handler(m, c):
        return Message(RecordDict(), reply_to=m)

    monkeypatch.delenv(cost.LOG_ENV, raising=False)
    assert cost.message_cost(msg, context, handler).metadata.reply_to_message_id == \
        msg.metadata.message_id
    log = tmp_path / "cost.jsonl"
    monkeypatch.setenv(cost.LOG_ENV, str(log))
    monkeypatch.setattr(cost, "_seen", {"messages": 0, "cpu_after": 0.0})
    cost.message_cost(msg, context, handler)
    cost.message_cost(msg, context, handler)
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert (first["type"], first["group"], first["built"]) == ("evaluate.model", "2", False)
    assert first["first_in_process"] and not second["first_in_process"]
    assert first["cpu_before"] > 0 and first["wall_before"] > 0   # this test process's start
    assert second["wall_before"] is None and second["cpu_handler"] >= 0


def test_a_start_that_fails_stops_the_processes_it_started(tmp_path, monkeypatch):
    fed = federation(tmp_path)

    def node_fails(k):
        raise ClusterfedError(f"node {k} could not start")

    monkeypatch.setattr(fed, "start_node", node_fails)
    with pytest.raises(ClusterfedError, match="node 0"):
        fed.start()
    assert fed.processes and not any(p.alive() for p in fed.processes.values())
