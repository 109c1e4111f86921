"""The per-method option reference, generated from the code so it cannot drift from it.

Every registered algorithm is a dataclass; each of its init fields is an option
`algorithm.FIELD`. The reference lists them with their defaults, their valid choices (a
class's `_kinds`) and the comments written beside or above them in the source. The docs site
builds it at each build (mkdocs_hooks.py); `python -m clusterfed.docs_gen` prints it.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
import typing
from typing import Any

import yaml

from clusterfed.algorithms import ALGORITHMS

TITLE = "# Method options"


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comments on its line and the comment lines just above it, over the
    class and its bases (a subclass's own comment wins)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass.__module__ == "builtins":
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        found.update(_comments_in(source))
    return found


def _comments_in(source: str) -> dict[str, str]:
    comments: dict[int, str] = {}    # line -> comment text
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(token.start[0])
    lines = source.splitlines()
    found: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        name, colon, _ = stripped.partition(":")
        if not colon or not name.isidentifier() or line[:len(line) - len(line.lstrip())] != "    ":
            continue
        above = []
        previous = number - 1
        while previous in comments and previous not in code_lines:
            above.insert(0, comments[previous])
            previous -= 1
        beside = [comments[number]] if number in comments else []
        text = " ".join(above + beside)
        if text:
            found[name] = text
    return found


def _default_value(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _default(field: dataclasses.Field[Any], group: Any = None) -> str:
    """The field's default as it is written in a config (YAML), or "required"; in an option
    group, the method's own group's value (a method may default otherwise, e.g. PACFL's
    selector)."""
    value = _default_value(field) if group is None else getattr(group, field.name)
    if value is dataclasses.MISSING:
        return "required"
    if isinstance(value, tuple | frozenset | set):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    return text.removesuffix("...").strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _summary(cls: type) -> str:
    """The first paragraph of the class's docstring, else of its module's."""
    doc = inspect.getdoc(cls) if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") \
        else sys.modules[cls.__module__].__doc__
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def literal_choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """Field name -> its values, for the fields typed as a Literal (e.g. `Weighting`)."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):   # a name only a type checker imports
        return {}
    return {name: typing.get_args(hint) for name, hint in hints.items()
            if typing.get_origin(hint) is typing.Literal}


def method_options(name: str) -> list[tuple[str, str, str]]:
    """(option, default, meaning) for every init field of the method `name`."""
    return options_of(ALGORITHMS.get(name))


def options_of(cls: type, prefix: str = "", group: Any = None) -> list[tuple[str, str, str]]:
    """(option, default, meaning) for every init field of the dataclass `cls`; a field whose
    default is itself a dataclass (an option group, e.g. `k_choice`) gives one row for each
    of the group's options, `group.option`, with the values of the method's default group."""
    comments = field_comments(cls)
    choices = {**literal_choices(cls), **getattr(cls, "_kinds", {})}
    rows = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        default = _default_value(field)
        if dataclasses.is_dataclass(default):
            rows += options_of(type(default), f"{prefix}{field.name}.", default)
            continue
        meaning = comments.get(field.name, "")
        if field.name in choices:
            meaning = f"one of {', '.join(map(str, choices[field.name]))}. {meaning}".strip()
        rows.append((prefix + field.name, _default(field, group), meaning))
    return rows


def options_reference() -> str:
    """The whole reference as Markdown, one section a registered method."""
    out = [TITLE, "",
           "Generated from the code (`clusterfed/docs_gen.py`) at every docs build: each",
           "method's dataclass fields, their defaults and the comments beside them in the",
           "source. Set one as `algorithm.OPTION=VALUE` (e.g. `algorithm.weighting=uniform`),",
           "an option of a group as `algorithm.GROUP.OPTION=VALUE` (e.g.",
           "`algorithm.k_choice.selector=hdbscan`: the choice of the number of clusters,",
           "compared in [the benchmark](benchmark.md), \"Selectors\"). What the methods do:",
           "[Methods](methods.md).", ""]
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        module = cls.__module__.replace(".", "/") + ".py"
        out += [f"## `{name}`", "", _summary(cls), "",
                f"Source: `{module}`, class `{cls.__name__}`.", ""]
        rows = method_options(name)
        if not rows:
            out += ["No options.", ""]
            continue
        out += ["| option | default | meaning |", "| --- | --- | --- |"]
        out += [f"| `{option}` | `{_cell(default)}` | {_cell(meaning)} |"
                for option, default, meaning in rows]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(options_reference())
