"""The config reference: every key, its default, its valid range and its meaning, as a markdown table."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import types
import typing

import yaml

from nmt.config.load import join_key
from nmt.config.ranges import range_of
from nmt.config.schema import ExperimentConfig


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a config dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[union-attr]
    return docs


def reference_markdown() -> str:
    """A markdown table of every config key, its default, its valid values (a range or a list) and its meaning.

    A corpus section's keys are listed once, under `data.train`; `data.valid` and each
    `data.test.NAME` take the same keys.
    """
    lines = ["| key | default | range | meaning |", "| --- | --- | --- | --- |"]
    listed: dict[type, str] = {}

    def walk(cls: type, prefix: str) -> None:
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = join_key(prefix, f.name)
            tp = hints[f.name]
            union = typing.get_origin(tp) in (typing.Union, types.UnionType)
            inner = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
            if dataclasses.is_dataclass(tp) and f.default_factory is not dataclasses.MISSING:
                walk(tp, key)
                continue
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = None
            if isinstance(default, tuple):
                default = list(default)
            shown = "(required)" if default is None and dataclasses.is_dataclass(inner[0]) else f"`{yaml.safe_dump(default, default_flow_style=True).strip().removesuffix('...').strip()}`"
            rng = range_of(f)
            allowed = f"`{rng}`" if rng else _choices(inner[0])
            section = _section(inner[0])
            doc = docs.get(f.name, "")
            if section is not None and section in listed:
                doc += f" Keys as under `{listed[section]}`."
            lines.append(f"| `{key}` | {shown} | {allowed} | {doc} |")
            if section is not None and section not in listed:
                listed[section] = key
                walk(section, key)

    walk(ExperimentConfig, "")
    return "\n".join(lines)


def _choices(tp: object) -> str:
    """"one of `a`, `b`" for a Literal (or a list of one), else ""."""
    if typing.get_origin(tp) is list:
        tp = typing.get_args(tp)[0]
        prefix = "each one of"
    else:
        prefix = "one of"
    if typing.get_origin(tp) is typing.Literal:
        return f"{prefix} " + ", ".join(f"`{str(a).lower() if isinstance(a, bool) else a}`"  # as YAML writes it
                                        for a in typing.get_args(tp))
    return ""


def _section(tp: object) -> type | None:
    """The config dataclass a field holds, directly or as the values of a dict (`data.test`)."""
    if typing.get_origin(tp) is dict:
        tp = typing.get_args(tp)[1]
    return tp if dataclasses.is_dataclass(tp) and isinstance(tp, type) else None


if __name__ == "__main__":
    print(reference_markdown())
