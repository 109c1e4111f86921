"""Shared fixtures. Tests that need ../shared/data skip with a clear message where it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from clusterfed.sim.processes import usable_cores

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist workers share the cores: torch in each takes its share, not all of them.
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, usable_cores() // int(workers)))


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
