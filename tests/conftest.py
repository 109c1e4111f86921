"""Shared fixtures. Tests that need ../shared/data skip with a clear message where it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from clusterfed.sim.processes import usable_cores
from clusterfed.strict_json import loads as strict_loads

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist workers share the cores: torch in each takes its share, not all of them.
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, usable_cores() // int(workers)))


# What the library writes for other programs to read: strict JSON, every file the suite wrote.
STRICT_JSON = ("summary.json", "comparison.json", "sweep.json", "reproduce.json",
               "benchmark.json", "scenario.json")
STRICT_JSON_LINES = ("metrics.jsonl", "events.jsonl")


def not_strict_json(root: Path) -> list[str]:
    """The files under `root` a strict JSON parser refuses (NaN, Infinity, broken), with why."""
    bad = []
    for path in sorted(root.rglob("*.json*")):
        if path.name not in STRICT_JSON + STRICT_JSON_LINES or not path.is_file():
            continue
        text = path.read_text()
        documents = text.splitlines() if path.name in STRICT_JSON_LINES else [text]
        try:
            for document in documents:
                if document.strip():
                    strict_loads(document)
        except ValueError as err:
            bad.append(f"{path}: {err}")
    return bad


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a test wrote a summary or metrics file strict parsers reject."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or getattr(factory, "_basetemp", None) is None:
        return
    bad = not_strict_json(factory.getbasetemp())
    if bad:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "files that are not strict JSON (NaN or Infinity written)",
                               red=True)
        for line in bad:
            reporter.write_line(line, red=True) if reporter else print(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def shared_data_dir() -> Path | None:
    """The real datasets: $CLUSTERFED_SHARED_DATA, else ../shared/data beside the repository."""
    explicit = os.environ.get("CLUSTERFED_SHARED_DATA")
    candidate = Path(explicit) if explicit else REPO.parent / "shared" / "data"
    return candidate if (candidate / "mnist" / "raw").is_dir() else None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("real datasets not found: set CLUSTERFED_SHARED_DATA or place them at "
                    "../shared/data (MNIST idx files under mnist/raw/)")
    return path


@pytest.fixture(autouse=True)
def _isolated_data_root(tmp_path_factory: pytest.TempPathFactory,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    # No test may read or write the user's real cache folder.
    monkeypatch.setenv("CLUSTERFED_DATA", str(tmp_path_factory.getbasetemp() / "data-root"))


@pytest.fixture(autouse=True)
def _fast_tests_run_no_simulation(request: pytest.FixtureRequest,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # `make test-fast` stays fast only while its tests (marker `fast`) build no Simulation.
    if request.node.get_closest_marker("fast") is None:
        return
    from clusterfed.sim.simulation import Simulation

    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail(f"{request.node.nodeid} is marked fast but runs a simulation: "
                    "remove the module's `pytestmark = pytest.mark.fast`")
    monkeypatch.setattr(Simulation, "__init__", refuse)


@pytest.fixture
def torch_threads():
    """Set torch's thread count for the test: `torch_threads(n)`; the count before is restored
    after it, so no later test runs at a leaked count."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture
def one_thread(torch_threads):
    """torch at one thread for the test, as every worker process computes: a sequential
    reference then sums in the workers' order (the thread count changes float sums)."""
    torch_threads(1)
