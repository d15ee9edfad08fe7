"""The config reference: every key, its default, its valid range and its meaning, as a markdown table."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing

import yaml

from nmt.config.load import join_key
from nmt.config.schema import ExperimentConfig, range_of


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
    """A markdown table of every config key, its default, its valid range (numbers) and its meaning."""
    lines = ["| key | default | range | meaning |", "| --- | --- | --- | --- |"]

    def walk(cls: type, prefix: str) -> None:
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = join_key(prefix, f.name)
            tp = hints[f.name]
            inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
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
            lines.append(f"| `{key}` | {shown} | {f'`{rng}`' if rng else ''} | {docs.get(f.name, '')} |")

    walk(ExperimentConfig, "")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown())
