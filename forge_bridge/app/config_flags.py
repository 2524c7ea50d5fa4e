"""Command-line flags made from config dataclasses, so each default and its explanation live in
one place: the dataclass field and the docstring under it."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
from typing import Any, Sequence, cast

from forge_bridge.core.errors import WrongType


def field_docs(cls: type) -> dict[str, str]:
    """field name -> the docstring written under it (inherited fields included)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = cast(ast.ClassDef, ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]).body
        for field, doc in zip(body, body[1:]):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)):
                docs[field.target.id] = " ".join(doc.value.value.split())
    return docs


def _value_type(field: dataclasses.Field) -> type:
    if field.default is not None and not isinstance(field.default, bool):
        return type(field.default)
    annotation = str(field.type)
    if isinstance(field.default, bool) or annotation.startswith("bool"):
        return bool
    for name, kind in (("int", int), ("float", float), ("str", str)):
        if annotation.split("|")[0].strip() == name:
            return kind
    raise WrongType(f"{field.name}: no command-line type for {annotation!r}")


def setting(cls: type, name: str) -> tuple[type, dataclasses.Field]:
    """The dataclass and field a setting's name means: a field of `cls`, or a flat name of a
    trainer config (`lr`: `OptimizerConfig.lr`, trainer/config.py's FLAT_NAMES)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name in fields:
        return cls, fields[name]
    from forge_bridge.trainer.config import FLAT_NAMES, PARTS

    part, field = FLAT_NAMES[name]
    return PARTS[part], {f.name: f for f in dataclasses.fields(PARTS[part])}[field]


def add_config_flags(parser: argparse.ArgumentParser, cls: type, names: Sequence[str],
                     aliases: dict[str, str] | None = None) -> None:
    """Add `--field-name` for each named field of `cls`: its type, its docstring and default as
    help. Flags not given are absent from the parsed namespace (`config_kwargs` leaves them
    to the dataclass's defaults)."""
    for name in names:
        part, field = setting(cls, name)
        docs = field_docs(part)
        flags = [f"--{name.replace('_', '-')}"] + ([aliases[name]] if aliases and name in aliases else [])
        help_text = f"{docs.get(field.name, '')} (default: {field.default})".replace("%", "%%")
        kind = _value_type(field)
        if kind is tuple:  # a tuple of one type: `--flag A B C`
            if not field.default:
                raise WrongType(f"{name}: no command-line type for an empty tuple default")
            first = cast(tuple, field.default)[0]  # kind is the default's own type here
            parser.add_argument(*flags, dest=name, nargs="+", type=type(first), default=argparse.SUPPRESS,
                                metavar=name.upper(), help=help_text)
        elif kind is bool:
            parser.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(*flags, dest=name, type=kind, default=argparse.SUPPRESS,
                                metavar=name.upper(), help=help_text)


def config_kwargs(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The fields the user set on the command line."""
    return {name: tuple(value) if isinstance(value, list) else value
            for name in names if hasattr(args, name) for value in [getattr(args, name)]}


__all__ = ["add_config_flags", "config_kwargs", "field_docs"]
