"""The README's quickstart table is what `make run` prints (on a 2-core machine: torch's
default of 2 threads). Five minutes of both cores, so `make reproduce-tests` runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import cli

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "algorithm   mean acc    ARI  clusters  seconds"


def table_rows(text: str) -> dict[str, tuple[str, str, str]]:
    """algorithm -> (mean acc, ARI, clusters) of the first such table in `text`; seconds are
    wall time and not compared."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == HEADER) + 2
    rows = {}
    for line in lines[start:]:
        fields = line.split()
        if len(fields) != 5:
            break
        rows[fields[0]] = (fields[1], fields[2], fields[3])
    return rows


def differences(readme: str, printed: str) -> list[str]:
    want, got = table_rows(readme), table_rows(printed)
    return [f"{name}: README {want.get(name)}, printed {got.get(name)}"
            for name in sorted(set(want) | set(got)) if want.get(name) != got.get(name)]


def test_table_rows_and_differences_by_hand():
    printed = f"{HEADER}\n---\nfedavg  0.7841  0.000  1  11.8\nlcfl  0.9295  1.000  4  10.2\n"
    readme = f"```\n{HEADER}\n---\nfedavg  0.7841  0.000  1  17.9\nlcfl  0.8227  0.678  3  9.0\n```"
    assert table_rows(printed) == {"fedavg": ("0.7841", "0.000", "1"),
                                   "lcfl": ("0.9295", "1.000", "4")}
    assert differences(readme, printed) == [
        "lcfl: README ('0.8227', '0.678', '3'), printed ('0.9295', '1.000', '4')"]
    assert differences(printed, printed) == []


@pytest.mark.slow
def test_readme_quickstart_table_is_what_make_run_prints(capsys, tmp_path):
    code, out, err = cli(capsys, "compare", "quickstart", "run.threads=2", "run.progress=false",
                         "--out", str(tmp_path))
    assert code == 0, err
    assert differences(README.read_text(), out) == []
