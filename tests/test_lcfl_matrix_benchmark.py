"""benchmarks/lcfl_matrix.py runs every path it times, at a toy size, and its figures add up."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "lcfl_matrix.py"


@pytest.fixture(scope="module")
def lcfl_matrix():
    spec = importlib.util.spec_from_file_location("lcfl_matrix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_path_runs_and_the_matrix_is_its_rows(lcfl_matrix):
    m = 3
    r = lcfl_matrix.measure(m, rows=1, images=4, workers=2, processes_max=m,
                            peaks={1: 10.0, 2: 20.0})
    assert r["model_evaluations"] == m * m and r["extrapolated"]
    # Every path was timed, the worker pools included (plain and grouped).
    for key in ("seconds_per_row", "vectorised_row_seconds", "grouped_row_seconds",
                "processes_evaluations_per_second", "grouped_workers_evaluations_per_second"):
        assert r[key] > 0, key
    assert r["matrix_seconds"] == pytest.approx(m * r["seconds_per_row"] + r["assemble_seconds"])
    assert r["grouped_workers_matrix_seconds"] == pytest.approx(
        m * m / r["grouped_workers_evaluations_per_second"])
    # The bound: M^2 x images forwards at each peak (GFLOP/s).
    flops = r["forward_flops_per_image"] * 4 * m * m
    assert r["matrix_flops"] == pytest.approx(flops)
    assert r["bound_seconds"][2] == pytest.approx(flops / 20e9)
    # A larger M beyond processes_max takes the pools' rates from the smaller one.
    big = lcfl_matrix.measure(4, rows=1, images=4, processes_max=m,
                              processes_rate=r["processes_evaluations_per_second"],
                              grouped_workers_rate=r["grouped_workers_evaluations_per_second"],
                              peaks={1: 10.0, 2: 20.0})
    assert big["processes_extrapolated_from_smaller_m"]
    assert big["grouped_workers_matrix_seconds"] == pytest.approx(
        16 / r["grouped_workers_evaluations_per_second"])
