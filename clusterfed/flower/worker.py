"""A long-lived ClientApp process beside a SuperNode started with `--isolation process`.

Flower 1.42's (as 1.41's) `flwr-clientapp` serves one message and exits, in both isolation modes
(the SuperNode's own SuperExec, or a `flower-superexec` beside it, starts one per message), so every
message pays for a fresh interpreter, Flower's and torch's imports and the node's data. This
process takes the SuperExec's place: it claims the node's ClientApp tasks on the SuperNode's
Runtime API one at a time and runs each here, so the imports, the loaded ClientApp and
`clusterfed.flower.node`'s cached federation serve every message of a run.

    flower-supernode ... --isolation process --host 127.0.0.1 --port 9094
    clusterfed flower worker --runtime-api-address 127.0.0.1:9094 --insecure

Each task follows Flower's ClientApp protocol (pull the input with the task's token, run the
app, push the reply and the task's final status) with Flower's own functions for each step.
What Flower's per-message process gives and this one does not: a fresh interpreter per message
(state, leaks and crashes carry over; a hard crash ends the worker and its node's replies until
it is restarted), and runtime dependency installation.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from flwr.app import Message
from flwr.app.error import Error
from flwr.cli.install import install_from_fab
from flwr.clientapp.client_app import ClientApp, LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.auth import add_superexec_auth_secret_args, load_superexec_auth_secret
from flwr.supercore.constant import TaskType
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
    SuperExecAuthHttpInterceptor,
)
from flwr.supercore.retry import RetryInvoker, exponential
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import (
    pull_task_input,
    push_message,
    push_task_output,
)

log = logging.getLogger("clusterfed.flower.worker")

# Seconds between task claims: short right after a task (a round's next message follows soon),
# doubling while idle up to the longest, which is Flower's SuperExec's own interval.
POLL_MIN, POLL_MAX = 0.05, 1.0
# The SuperNode expires a claimed task after 60 s without a heartbeat (Flower 1.41, 1.42).
HEARTBEAT_SECONDS = 20.0
PRELOAD = "clusterfed.flower.client_app"
ACQUIRE_TASK = "/flwr.proto.Runtime/AcquireTask"
READY = "serving the ClientApp tasks of the SuperNode at"   # logged once ready


def _client(address: str, insecure: bool, root_certificates: str | None,
            token: str | None = None, secret: bytes | None = None) -> RuntimeHttpClient:
    interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp")]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    if secret is not None:   # the SuperNode's --superexec-auth-secret-file: signed claims
        interceptors.append(SuperExecAuthHttpInterceptor(
            master_secret=secret, protected_methods={ACQUIRE_TASK}))
    # Retry only lost connections, a few times: Flower's default invoker SIGINTs its process
    # on an expired token (401), which here would end the worker, not one task.
    retry = RetryInvoker(lambda: exponential(max_delay=2.0), httpx.TransportError,
                         max_tries=5, max_time=30.0)
    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=insecure,
        root_certificates=None if insecure else root_certificates,
        interceptors=interceptors, retry_invoker=retry)


class _Heartbeat:
    """Keeps one claimed task alive; never signals the process (Flower's sender SIGINTs its
    one-message process when the task has ended, which would end this worker)."""

    def __init__(self, client: RuntimeHttpClient, every: float = HEARTBEAT_SECONDS) -> None:
        self._client, self._every = client, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
            except Exception as err:  # noqa: BLE001 (the task's own calls report real failures)
                log.debug("heartbeat failed: %s", err)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Worker:
    """Claims and runs the ClientApp tasks of one SuperNode, one at a time, in this process."""

    def __init__(self, address: str, *, insecure: bool = True,
                 root_certificates: str | None = None, secret: bytes | None = None) -> None:
        self.address, self.insecure = address, insecure
        self.root_certificates = root_certificates
        self.tasks = 0
        self._apps: dict[str, ClientApp] = {}   # FAB hash -> its loaded ClientApp
        self._claims = _client(address, insecure, root_certificates, secret=secret)

    def claim(self) -> str | None:
        """The token of a pending ClientApp task of this node, if there is one."""
        res = self._claims.AcquireTask(
            AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        return res.token if res.HasField("task") and res.token else None

    def app_for(self, fab: Any, fab_id: str, fab_version: str) -> ClientApp:
        """The run's ClientApp, installed and imported once per FAB (its modules stay loaded)."""
        if fab.hash_str not in self._apps:
            install_from_fab(fab.content, skip_prompt=True)
            load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
            self._apps[fab.hash_str] = load(fab_id, fab_version, fab.hash_str)
        return self._apps[fab.hash_str]

    def run_task(self, token: str) -> bool:
        """Run one claimed task to its end; True when its reply was delivered."""
        client = _client(self.address, self.insecure, self.root_certificates, token)
        context, status, details = None, SubStatus.FAILED, "the ClientApp task failed"
        try:
            with _Heartbeat(client):
                message, context, run, fab = pull_task_input(client)
                try:
                    app = self.app_for(fab, run.fab_id, run.fab_version)
                    reply = app(message=message, context=context)
                    failed = None
                except Exception as err:  # noqa: BLE001 (an app's error is its reply)
                    code = (ErrorCode.LOAD_CLIENT_APP_EXCEPTION
                            if isinstance(err, LoadClientAppError)
                            else ErrorCode.CLIENT_APP_RAISED_EXCEPTION)
                    failed = f"{type(err)}:<'{err}'>"
                    log.exception("the ClientApp raised an exception")
                    reply = Message(Error(code=code, reason=failed), reply_to=message)
                push_message(client, reply, context)
                if failed is None:
                    status, details = SubStatus.COMPLETED, ""
                else:
                    details = failed
        except Exception:  # noqa: BLE001 (one task's failure must not end the worker)
            log.exception("ClientApp task failed")
        finally:
            push_task_output(client=client, context=context, sub_status=status, details=details)
            client.close()
            self.tasks += 1
        return status == SubStatus.COMPLETED

    def serve(self, stop: Callable[[], bool] = lambda: False,
              sleep: Callable[[float], None] = time.sleep) -> None:
        """Claim and run tasks until `stop()`; poll faster right after a task."""
        wait, reachable = POLL_MAX, True
        while not stop():
            try:
                token = self.claim()
                reachable = True
            except httpx.HTTPError as err:   # the SuperNode is starting, restarting or gone
                if reachable:
                    log.info("waiting for the SuperNode's Runtime API at %s (%s)",
                             self.address, err)
                token, wait, reachable = None, POLL_MAX, False
            if token is not None:
                self.run_task(token)
                wait = POLL_MIN
                continue
            sleep(wait)
            wait = min(2 * wait, POLL_MAX)

    def close(self) -> None:
        self._claims.close()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clusterfed flower worker", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--runtime-api-address", required=True,
                   help="The SuperNode's Runtime API, HOST:PORT (its --host and --port).")
    p.add_argument("--insecure", action="store_true",
                   help="Plain HTTP to the Runtime API (the SuperNode has no --ssl-certfile).")
    p.add_argument("--root-certificates", help="CA of the Runtime API's TLS certificate.")
    p.add_argument("--parent-pid", type=int,
                   help="Exit when this process (the SuperNode) exits.")
    p.add_argument("--preload", default=PRELOAD, metavar="MODULE",
                   help="Import this module before the first task, so a (re)started node "
                        "answers its first message without waiting for torch's import "
                        f"(default {PRELOAD}; '' for none).")
    add_superexec_auth_secret_args(p)   # the same secret file as the SuperNode's
    return p


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM unwinds like Ctrl-C, so a task in progress still reports its end; a second
    one (a process group and its members are signalled alike) must not cut the unwinding."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.insecure and not args.root_certificates:
        parser().error("give --insecure or --root-certificates")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)   # a line per poll otherwise
    signal.signal(signal.SIGTERM, _terminate)
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    if args.preload:
        importlib.import_module(args.preload)
    try:
        secret = load_superexec_auth_secret(args.superexec_auth_secret_file)
    except ValueError as err:
        parser().error(str(err))
    worker = Worker(args.runtime_api_address, insecure=args.insecure,
                    root_certificates=args.root_certificates, secret=secret)
    log.info("%s %s", READY, args.runtime_api_address)
    try:
        worker.serve()
    except KeyboardInterrupt:
        pass
    finally:
        worker.close()
        log.info("stopped after %d tasks", worker.tasks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
