"""A whole Flower federation on this machine: one SuperLink and N SuperNodes on 127.0.0.1.

Every process runs in its own session (process group) and logs to a file in the work folder.
`stop()` ends them all, their descendants included (the SuperLink starts its SuperExec detached),
and runs from `__exit__`, so a failure or Ctrl-C leaves nothing behind. The `flwr` CLI reads its
SuperLink connection from a config in the work folder (FLWR_HOME), never from the user's home.
"""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import tomli_w

from clusterfed.errors import ClusterfedError
from clusterfed.flower.app import write_app
from clusterfed.flower.certs import TlsFiles, make_node_keys, make_tls

CONNECTION = "clusterfed-local"
HOST = "127.0.0.1"
# How a SuperNode runs its ClientApp: "process", a long-lived worker beside it (cheap per
# message); "subprocess", Flower's default, a fresh process per message.
ISOLATION_MODES = ("process", "subprocess")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def flower_command(name: str) -> str:
    """A Flower executable: beside this Python first (a venv need not be activated)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise ClusterfedError(f"{name} not found: install Flower with "
                              f"pip install 'clusterfed[flower]'")
    return found


def worker_argv(runtime_api_address: str, *, root_certificates: str | None = None,
                parent_pid: int | None = None, secret_file: Path | None = None) -> list[str]:
    """The command line of the ClientApp worker of the SuperNode whose Runtime API is at the
    address (see clusterfed.flower.worker)."""
    argv = [sys.executable, "-m", "clusterfed.flower.worker",
            "--runtime-api-address", runtime_api_address]
    argv += (["--root-certificates", root_certificates] if root_certificates
             else ["--insecure"])
    if parent_pid is not None:
        argv += ["--parent-pid", str(parent_pid)]
    if secret_file is not None:
        argv += ["--superexec-auth-secret-file", str(secret_file)]
    return argv


def _children_of() -> dict[int, list[int]]:
    """ppid -> pids of every process, from /proc (Linux); empty elsewhere."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, out, todo = _children_of(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Process:
    """One started process (a session leader) and its log."""

    name: str
    popen: subprocess.Popen[Any]
    log_path: Path
    log_file: IO[Any] | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process, its group and its descendants; SIGKILL what is left."""
        pids = [self.popen.pid, *descendants(self.popen.pid)]
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
            _signal_group(self.popen.pid, sig)
            for pid in pids:
                _signal(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(_exists(p) for p in pids):
                self.popen.poll()
                time.sleep(0.1)
            if not any(_exists(p) for p in pids):
                break
        self.popen.poll()
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None

    def kill(self) -> None:
        """SIGKILL at once, as a crash would: the process, its group and its descendants."""
        pids = [self.popen.pid, *descendants(self.popen.pid)]
        _signal_group(self.popen.pid, signal.SIGKILL)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _exists(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@dataclass
class LocalFederation:
    """A SuperLink and `num_nodes` SuperNodes (node K serves client K) on 127.0.0.1.

    `secure`: TLS on the SuperLink (test certificates made here) and SuperNode authentication
    (each node's key registered with the SuperLink before the node starts).
    `simulation`: no SuperNodes; the SuperLink runs Flower's simulation runtime (Ray), with
    `num_nodes` virtual nodes and the given per-node resources.
    `own_data`: node K serves the data in `own_data[K]` (`data-path`), not a scenario's share.
    `secret_file`: every node's privacy secret (`privacy-secret-file`), never the server's.
    `isolation`: "process" (each SuperNode with `--isolation process` and one long-lived
    ClientApp worker beside it, clusterfed.flower.worker) or "subprocess" (Flower's default: a
    fresh `flwr-clientapp` process per message).
    """

    num_nodes: int
    workdir: Path
    secure: bool = False
    simulation: bool = False
    data_dir: str | None = None
    client_cpus: int = 1
    client_gpus: float = 0.0
    own_data: Sequence[Path] | None = None
    secret_file: Path | None = None
    isolation: str = "process"
    echo: Callable[[str], None] = print
    port: int = 0
    processes: dict[str, Process] = field(default_factory=dict)
    tls: TlsFiles | None = None
    node_keys: list[tuple[Path, Path]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_MODES:
            raise ClusterfedError(f"isolation {self.isolation!r}: use one of "
                                  f"{', '.join(ISOLATION_MODES)}")

    # Environment and files -----------------------------------------------------------------

    @property
    def flwr_home(self) -> Path:
        return self.workdir / "flwr-home"

    @property
    def app_dir(self) -> Path:
        return self.workdir / "app"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "FLWR_HOME": str(self.flwr_home),
            # Never let Flower pip-install the app's dependencies (it would pull a CUDA torch).
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_TELEMETRY_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        })
        return env

    def _spawn(self, name: str, argv: Sequence[str]) -> Process:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 (closed by Process.stop)
        popen = subprocess.Popen(list(argv), stdout=log_file, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=self.env(), cwd=self.workdir,
                                 start_new_session=True)
        proc = Process(name, popen, log_path, log_file)
        self.processes[name] = proc
        return proc

    def _write_connection(self) -> None:
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        conn: dict[str, Any] = {"address": f"{HOST}:{self.port}"}
        if self.tls is not None:
            conn["root-certificates"] = str(self.tls.ca_cert)
        else:
            conn["insecure"] = True
        (self.flwr_home / "config.toml").write_text(tomli_w.dumps(
            {"superlink": {"default": CONNECTION, CONNECTION: conn}}))

    # Lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> LocalFederation:
        """Start the SuperLink and the SuperNodes; a start that fails stops what it started."""
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> LocalFederation:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        if self.secure:
            self.tls = make_tls(self.workdir / "certs")
            self.node_keys = make_node_keys(self.workdir / "keys", self.num_nodes)
        self._write_connection()
        write_app(self.app_dir)
        argv = [flower_command("flower-superlink"), "--host", HOST, "--port", str(self.port),
                "--disable-runtime-dependency-installation"]
        if self.tls is not None:
            argv += ["--ssl-ca-certfile", str(self.tls.ca_cert),
                     "--ssl-certfile", str(self.tls.server_cert),
                     "--ssl-keyfile", str(self.tls.server_key)]
        else:
            argv += ["--insecure"]
        if self.secure:
            argv += ["--enable-supernode-auth"]
        if self.simulation:
            argv += ["--simulation"]
        self.echo(f"starting flower-superlink on {HOST}:{self.port}"
                  + (" (TLS, SuperNode authentication)" if self.secure else ""))
        link = self._spawn("superlink", argv)
        self._wait_for_port(link, timeout)
        if self.simulation:
            return self
        if self.secure:
            for k, (_, public) in enumerate(self.node_keys):
                self._flwr(["supernode", "register", str(public), CONNECTION,
                            "--name", f"client-{k}"], timeout)
        for k in range(self.num_nodes):
            self.start_node(k)
        self.echo(f"started {self.num_nodes} flower-supernode processes (logs: {self.logs})")
        return self

    def _wait_for_port(self, proc: Process, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise ClusterfedError(f"{proc.name} exited with code {proc.popen.returncode}:\n"
                                      + proc.tail())
            try:
                with socket.create_connection((HOST, self.port), timeout=1.0):
                    return
            except OSError:
                time.sleep(0.2)
        raise ClusterfedError(f"{proc.name} did not open {HOST}:{self.port} in {timeout:.0f} s")

    def _flwr(self, args: Sequence[str], timeout: float) -> str:
        """Run a short `flwr` command, retrying while the SuperLink is still starting."""
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run([flower_command("flwr"), *args], capture_output=True,
                                  text=True, env=self.env(), cwd=self.workdir, timeout=timeout)
            if done.returncode == 0:
                return done.stdout
            if time.monotonic() > deadline:
                raise ClusterfedError(f"flwr {' '.join(args)} failed:\n{done.stdout}"
                                      f"{done.stderr}")
            time.sleep(1.0)

    @property
    def superexec_secret(self) -> Path | None:
        """With `secure` and workers: the secret a worker signs its task claims with, so no
        other local process can claim a node's tasks on its Runtime API."""
        if not (self.secure and self.isolation == "process"):
            return None
        path = self.workdir / "keys" / "superexec-secret"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_bytes(secrets.token_bytes(32))
        return path

    def node_argv(self, k: int, runtime_port: int | None = None) -> list[str]:
        node_config = f"partition-id={k} num-partitions={self.num_nodes}"
        if self.data_dir:
            node_config += f' data-dir="{self.data_dir}"'
        if self.own_data:
            node_config += f' data-path="{self.own_data[k]}"'
        if self.secret_file:
            node_config += f' privacy-secret-file="{self.secret_file}"'
        port = free_port() if runtime_port is None else runtime_port
        argv = [flower_command("flower-supernode"), "--superlink", f"{HOST}:{self.port}",
                "--node-config", node_config, "--host", HOST, "--port", str(port),
                "--isolation", self.isolation]
        if self.tls is not None:
            argv += ["--root-certificates", str(self.tls.ca_cert)]
        else:
            argv += ["--insecure"]
        if self.secure:
            argv += ["--auth-supernode-private-key", str(self.node_keys[k][0])]
        if self.superexec_secret is not None:
            argv += ["--superexec-auth-secret-file", str(self.superexec_secret)]
        return argv

    def start_node(self, k: int) -> Process:
        """Start (or restart) the SuperNode serving client k (and its ClientApp worker)."""
        old = self.processes.get(f"supernode-{k}")
        if old is not None and old.alive():
            raise ClusterfedError(f"supernode-{k} is already running")
        runtime_port = free_port()
        node = self._spawn(f"supernode-{k}", self.node_argv(k, runtime_port))
        if self.isolation == "process":
            # The worker retries until the node's Runtime API is up, and exits with the node.
            self._spawn(f"clientapp-{k}", worker_argv(f"{HOST}:{runtime_port}",
                                                      parent_pid=node.popen.pid,
                                                      secret_file=self.superexec_secret))
        return node

    def kill_node(self, k: int) -> None:
        """SIGKILL the SuperNode of client k and its ClientApp processes, as a crash would."""
        self.processes[f"supernode-{k}"].kill()
        worker = self.processes.get(f"clientapp-{k}")
        if worker is not None and worker.alive():
            worker.kill()

    def submit(self, run_config: Mapping[str, Any], *, timeout: float | None = None,
               on_line: Callable[[str], None] | None = None) -> int:
        """`flwr run` the app with `run_config`, streaming its output; the exit code."""
        config_file = self.workdir / f"run-config-{time.time_ns()}.toml"
        config_file.write_text(tomli_w.dumps(dict(run_config)))
        argv = [flower_command("flwr"), "run", str(self.app_dir), CONNECTION,
                "--run-config", str(config_file), "--stream"]
        if self.simulation:
            argv += ["--federation-config",
                     f"num-supernodes={self.num_nodes} "
                     f"client-resources-num-cpus={int(self.client_cpus)} "
                     f"client-resources-num-gpus={float(self.client_gpus)}"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.env(), cwd=self.workdir,
                                text=True, bufsize=1, start_new_session=True)
        handle = Process("flwr-run", proc, self.logs / "flwr-run.log")
        self.processes["flwr-run"] = handle
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = None if timeout is None else time.monotonic() + timeout
        with open(self.logs / "flwr-run.log", "a") as log:
            while True:
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    if deadline is not None and time.monotonic() > deadline:
                        handle.stop()
                        raise ClusterfedError(f"the run did not finish in {timeout:.0f} s; "
                                              f"logs: {self.logs}") from None
                    continue
                if line is None:
                    break
                log.write(line)
                log.flush()
                (on_line or self.echo)(line.rstrip("\n"))
        return proc.wait()

    def stop(self) -> None:
        """End every process started here, newest first."""
        for proc in reversed(list(self.processes.values())):
            proc.stop()

    def __enter__(self) -> LocalFederation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def raise_on_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into SystemExit (so `finally` blocks stop the federation); returns undo."""
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)
