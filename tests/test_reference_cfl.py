"""benchmarks/reference_cfl.py: it skips without the authors' code, and runs their module as is."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.cluster import AgglomerativeClustering

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def reference_cfl():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("reference_cfl",
                                                      BENCHMARKS / "reference_cfl.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_skips_without_the_authors_code(reference_cfl, monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("CLUSTERFED_CFL_AUTHORS", raising=False)
    assert reference_cfl.main([]) == 0
    assert "SKIP reference_cfl" in capsys.readouterr().out
    # A folder without their fl_devices.py skips too.
    assert reference_cfl.main(["--authors", str(tmp_path)]) == 0
    assert "SKIP reference_cfl" in capsys.readouterr().out


# Their cluster_clients, in the shape of their file: scikit-learn's old keyword `affinity`.
AUTHORS_STYLE = """
import numpy as np
from sklearn.cluster import AgglomerativeClustering

def cluster_clients(S):
    clustering = AgglomerativeClustering(affinity="precomputed", linkage="complete").fit(-S)
    return (np.argwhere(clustering.labels_ == 0).flatten(),
            np.argwhere(clustering.labels_ == 1).flatten())
"""


def test_their_module_runs_unchanged_on_a_current_scikit_learn(reference_cfl, tmp_path):
    (tmp_path / "fl_devices.py").write_text(AUTHORS_STYLE)
    before = (tmp_path / "fl_devices.py").read_text()
    module = reference_cfl.load_authors(tmp_path)
    # Two groups of clients whose updates point apart: similarity 1 within, -1 across.
    side = np.array([1, 1, 1, -1, -1])
    c1, c2 = module.cluster_clients(np.outer(side, side).astype(float))
    assert sorted(map(sorted, (c1.tolist(), c2.tolist()))) == [[0, 1, 2], [3, 4]]
    assert (tmp_path / "fl_devices.py").read_text() == before   # the file is not touched
    if "affinity" not in inspect.signature(AgglomerativeClustering).parameters:
        plain = {}
        exec(compile(AUTHORS_STYLE, "fl_devices.py", "exec"), plain)
        with pytest.raises(TypeError):   # what the rebinding is for
            plain["cluster_clients"](np.eye(3))
