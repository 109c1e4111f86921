"""The generated option reference lists every option of every registered method."""

from __future__ import annotations

import dataclasses

import pytest

from clusterfed.algorithms import ALGORITHMS
from clusterfed.docs_gen import field_comments, method_options, options_reference

pytestmark = pytest.mark.fast


def sections(text: str) -> dict[str, str]:
    """Method name -> its section of the reference."""
    parts = text.split("\n## `")[1:]
    return {part.split("`", 1)[0]: part for part in parts}


def option_names(cls: type) -> set[str]:
    """Init fields; those of an option group (a dataclass default) as group.option."""
    names = set()
    for f in dataclasses.fields(cls):
        if f.init and dataclasses.is_dataclass(f.default):
            names |= {f"{f.name}.{g.name}" for g in dataclasses.fields(f.default) if g.init}
        elif f.init:
            names.add(f.name)
    return names


def test_every_field_of_every_method_is_in_the_reference():
    found = sections(options_reference())
    assert sorted(found) == sorted(ALGORITHMS.names())
    for name in ALGORITHMS.names():
        rows = {line.split("`")[1] for line in found[name].splitlines()
                if line.startswith("| `")}
        assert rows == option_names(ALGORITHMS.get(name)), name


def test_an_option_group_shows_each_of_its_options():
    rows = {option: (default, meaning) for option, default, meaning in method_options("ifca")}
    assert "k_choice" not in rows and rows["k_choice.k"][0] == "null"
    default, meaning = rows["k_choice.selector"]
    assert default == "silhouette_gap_width"      # IFCA's own default, not the group's
    assert meaning.startswith("one of silhouette, eigengap, gap, davies_bouldin, hdbscan, "
                              "hdbscan_silhouette, silhouette_gap, silhouette_gap_width.")
    assert rows["k_choice.min_cluster_size"] == (
        "3", "hdbscan(_silhouette): the fewest clients of a cluster")
    # A Literal type (`aggregate.Weighting`) lists its values as a class's `_kinds` would.
    assert rows["weighting"][1].startswith("one of samples, uniform. ")


def test_a_row_has_the_default_the_choices_and_the_comment():
    rows = {option: (default, meaning) for option, default, meaning in method_options("cfl")}
    assert rows["gamma_max"] == ("0.1", "Eq. 39 (\"fixed\"); 0 accepts every split "
                                        "(authors' code)")
    default, meaning = rows["acceptance"]
    assert default == "estimated" and meaning.startswith("one of estimated, fixed. Which")
    assert rows["eps1"][0] == "null" and rows["newcomers"][0] == "[]"


def test_comments_above_and_beside_a_field_are_joined():
    @dataclasses.dataclass
    class Toy:
        # above, first line
        # above, second line
        a: int = 1   # beside a
        b: str = "x"
        c: list = dataclasses.field(default_factory=list)   # beside c

    assert field_comments(Toy) == {"a": "above, first line above, second line beside a",
                                   "c": "beside c"}


def test_a_group_shows_the_methods_own_defaults():
    """PACFL's and IFCA's k_choice default to other selectors than the group's class does."""
    pacfl = {option: default for option, default, _ in method_options("pacfl")}
    ifca = {option: default for option, default, _ in method_options("ifca")}
    lcfl = {option: default for option, default, _ in method_options("lcfl")}
    assert pacfl["k_choice.selector"] == "hdbscan_silhouette"
    assert ifca["k_choice.selector"] == "silhouette_gap_width"
    assert lcfl["k_choice.selector"] == "silhouette"
