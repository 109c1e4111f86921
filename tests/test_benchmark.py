"""`clusterfed benchmark`: the claims each clustered method makes, checked with its defaults."""

from __future__ import annotations

import json
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import pytest

from clusterfed.cli import entry
from clusterfed.experiments import benchmark as bench


def _row(method: str, scenario: str, seed: int, ari: float, clusters: int) -> dict:
    return {"dataset": "digits", "scenario": scenario, "seed": seed, "method": method,
            "ari": ari, "clusters": clusters, "accuracy": 0.9, "seconds": 1.0}


def test_verdicts_hold_each_method_to_its_own_claims_only():
    rows = [_row("pacfl", "label_swap", s, 0.0, 1) for s in range(3)]        # not claimed
    rows += [_row("pacfl", "rotation", s, a, 4) for s, a in enumerate([1.0, 1.0, 0.86])]
    rows += [_row("ifca", "rotation", s, a, 4) for s, a in enumerate([1.0, 0.8, 0.9])]
    rows += [_row("cfl", "rotation", s, 0.5, 3) for s in range(3)]            # not claimed
    rows += [_row("cfl", "iid", s, 1.0 if s else 0.0, 1 if s else 2) for s in range(3)]
    rows += [_row("fedavg", "iid", s, 1.0, 1) for s in range(3)]             # no claims
    summary = {(e["method"], e["scenario"]): e for e in bench.summarise(rows)}
    assert summary["pacfl", "label_swap"]["verdict"] == ""
    assert summary["pacfl", "rotation"]["verdict"] == "pass"                  # mean 0.953
    assert summary["ifca", "rotation"]["verdict"] == "FAIL"                   # mean 0.9
    assert summary["cfl", "rotation"]["verdict"] == ""
    assert summary["cfl", "iid"]["verdict"] == "FAIL"                         # one seed split
    assert summary["fedavg", "iid"]["verdict"] == ""
    assert summary["pacfl", "rotation"]["ari"] == pytest.approx((0.9533, 0.0808), abs=1e-3)
    assert bench.failures(bench.summarise(rows)) == ["digits/rotation/ifca", "digits/iid/cfl"]
    table = bench.markdown(bench.summarise(rows))
    assert "| digits | rotation | feature | pacfl | 0.953 ± 0.081 |" in table


def test_the_command_writes_its_table_and_resumes(tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["benchmark", "--quick", "--scenarios", "iid", "--methods", "cfl", "--seeds", "0",
            "--out", str(out), "train.rounds=2"]
    entry(args)
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["scenario"], r["method"], r["clusters"]) for r in rows] == [("iid", "cfl", 1)]
    assert (out / "benchmark.png").stat().st_size > 0
    text = (out / "benchmark.md").read_text()
    assert "| digits | iid | none | cfl |" in text
    assert text.startswith("Command: `clusterfed benchmark train.rounds=2 --quick --scenarios "
                           "iid --methods cfl --seeds 0`")
    entry(args)                                   # a second run finds the cell done
    assert len((out / "results.jsonl").read_text().splitlines()) == 1
    with pytest.raises(SystemExit) as exc:
        entry(["benchmark", "--scenarios", "nowhere", "--out", str(out)])
    assert exc.value.code == 2 and "unknown benchmark scenario" in capsys.readouterr().err


def _quick_seed_0(out, methods):
    return bench.run_benchmark(out, datasets=["digits"], scenarios=list(bench.QUICK["scenarios"]),
                               methods=methods, seeds=[0], overrides=["run.threads=1"])


# Eight minutes of a 2-core machine: `make bench-quick` (in CI) checks the same claims over
# three seeds, so `make test` leaves this per-seed check to `make reproduce-tests`.
@pytest.mark.slow
def test_quick_matrix_claims_on_seed_0(tmp_path):
    """The quick matrix's first seed, every clustered method at its defaults: ARI >= 0.95
    on each scenario it claims to see and exactly one cluster on the iid control (`make
    bench-quick` runs all three seeds and checks the mean, as CI does). One thread, as the
    recorded runs: the thread count changes float sums, and decisions with them."""
    # The cells are independent one-thread runs: two processes (every method in one of them,
    # FedEM's and FedRC's M-fold training apart) halve the wall time on 2 cores.
    halves = [list(bench.CLUSTERED[0::2]), list(bench.CLUSTERED[1::2])]
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        parts = pool.map(_quick_seed_0, [tmp_path / "a", tmp_path / "b"], halves)
        rows = [row for part in parts for row in part]
    assert sorted({r["method"] for r in rows}) == sorted(bench.CLUSTERED)
    missed = [f"{r['method']}/{r['scenario']}: ARI {r['ari']:.3f}, {r['clusters']} clusters"
              for r in rows if bench.verdict(r["method"], r["scenario"], [r["ari"]],
                                             [r["clusters"]]) == "FAIL"]
    assert not missed, missed
