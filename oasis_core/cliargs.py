"""Command-line options generated from a dataclass's fields, and the dataclass built back from them (stdlib only).

Each field becomes ``--<prefix><name-with-dashes>`` with its ``metadata["help"]``:

- ``bool``: ``--x`` / ``--no-x`` (a field named ``no_x``: ``--no-x`` alone);
- ``int`` / ``float`` (``Optional`` too): a number, finite, named in the error when it does not parse;
- ``dict`` / ``Mapping``: a JSON object, e.g. ``--synthetic '{"drift_rate": 0.2}'``;
- anything else (``str``): the text as given;
- ``metadata["choices"]``: the values argparse accepts; ``metadata["metavar"]``: the value's name in the help;
- ``metadata["type"]``: an argparse ``type`` callable that parses the text itself (a field of several types, e.g.
  ``int | str`` for ``--speculative-k 3`` or ``auto``; its ``ArgumentTypeError`` is the one-line error).

Every option defaults to ``argparse.SUPPRESS``: an option the user did not give is absent from the namespace, so
``values()`` returns only what was given and ``build()`` leaves every other field to the dataclass's own default,
the one set of defaults. ``build()`` turns the dataclass's ``ValueError`` / ``TypeError`` into a ``CliError`` whose
message names the option (``--top-k``) instead of the field (``ExecConfig.top_k``); ``OneLineParser`` reports every
usage error as one line on stderr with exit status 2.

    p = OneLineParser(prog="x")
    add_options(p, MyConfig, exclude={"internal"})
    cfg = build(MyConfig, p.parse_args(argv))
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import json
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .echo import LINE_LIMIT, show

__all__ = [
    "CliError",
    "OneLineParser",
    "add_options",
    "build",
    "flag",
    "number",
    "one_line",
    "option_message",
    "parse_json_object",
    "values",
]


class CliError(ValueError):
    """A bad command line; the message is one line naming the option and the value."""


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """``text`` on one line (runs of whitespace made one space), at most ``limit`` characters plus the note of a
    cut: every CLI error line passes through here, so no message, however large a value it quotes, floods a
    terminal or a log."""
    text = str(text)
    line = " ".join(text[: 4 * limit].split())
    if len(line) <= limit and len(text) <= 4 * limit:
        return line
    return f"{line[:limit]}... [message cut: {len(text)} characters]"


class OneLineParser(argparse.ArgumentParser):
    """``ArgumentParser`` whose errors are one line on stderr (``PROG: error: ...``) and exit status 2, no usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def flag(name: str, prefix: str = "") -> str:
    """The option of field ``name``: ``top_k`` -> ``--top-k`` (``prefix`` ``syn-``: ``--syn-top-k``)."""
    return "--" + prefix + name.replace("_", "-")


def number(kind):
    """An argparse ``type`` for ``int`` or ``float``: finite, and named in the error when it does not parse."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {'an integer' if kind is int else 'a number'}, got {show(text)}"
            ) from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be finite, got {show(text)}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def parse_json_object(text: str) -> dict:
    """A JSON object from the command line (the value of a ``dict`` field)."""
    try:
        v = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg} at column {e.colno}): {show(text)}") from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object ({{...}}), got {show(text)}")
    return v


parse_json_object.__name__ = "JSON"


def _base_type(tp):
    """``Optional[T]`` / ``T | None`` -> ``T``; other types unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
        raise TypeError(f"cliargs: unions of several types are not supported: {tp}")
    return tp


def _is_mapping(tp) -> bool:
    origin = typing.get_origin(tp) or tp
    return isinstance(origin, type) and issubclass(origin, collections.abc.Mapping)


def _fields(cls, exclude: Iterable[str]):
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"cliargs: {show(cls)} is not a dataclass")
    skip = set(exclude)
    unknown = skip - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise TypeError(f"cliargs: {cls.__name__} has no field {sorted(unknown)}")
    return [f for f in dataclasses.fields(cls) if f.init and f.name not in skip]


def _default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _shown(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, Mapping):
        return json.dumps(dict(v))
    return str(v)


def add_options(
    parser,
    cls,
    *,
    exclude: Iterable[str] = (),
    prefix: str = "",
    dest_prefix: str = "",
    helps: Mapping[str, str] | None = None,
    groups: Sequence[tuple[str, Sequence[str]]] = (),
    rest: str = "other options",
) -> None:
    """Add one option per init field of dataclass ``cls`` to ``parser`` (a parser or an argument group).

    ``exclude``: fields left out (the caller sets them, or they are not for this CLI); ``prefix``: put before every
    option name (``syn-``); ``dest_prefix``: before every namespace attribute (``syn_``), for two dataclasses in one
    parser; ``helps``: field -> help text replacing the field's own. A field without a default is a required option.
    ``groups``: (heading, fields) pairs, in the order ``--help`` shows them (``parser`` must then be a parser): what
    most runs set first, the tuning under headings; fields in no group go under ``rest``.
    """
    hints = typing.get_type_hints(cls)
    helps = dict(helps or {})
    where: dict[str, Any] = {}
    for title, names in groups:
        group = parser.add_argument_group(title)
        where.update({n: group for n in names})
    fields = _fields(cls, exclude)
    if groups and any(f.name not in where for f in fields):
        other = parser.add_argument_group(rest)
        where.update({f.name: other for f in fields if f.name not in where})
    for f in fields:
        target = where.get(f.name, parser)
        parse = f.metadata.get("type")
        tp = _base_type(hints[f.name]) if parse is None else None
        default = _default(f)
        text = helps.get(f.name, f.metadata.get("help", ""))
        negative = tp is bool and f.name.startswith("no_")
        if default is not dataclasses.MISSING and default is not None and not negative:
            text = f"{text} (default: {_shown(default)})"
        kw: dict[str, Any] = {
            "dest": dest_prefix + f.name,
            "default": argparse.SUPPRESS,
            "help": text.replace("%", "%%"),
        }
        if default is dataclasses.MISSING:
            kw["required"] = True
        if tp is bool:  # a negative name (no_transfer) gets its one flag: --no-no-transfer would read badly
            action = "store_true" if negative else argparse.BooleanOptionalAction
            target.add_argument(flag(f.name, prefix), action=action, **kw)
            continue
        if parse is not None:
            kw.update(type=parse, metavar=getattr(parse, "__name__", "VALUE").upper())
        elif tp in (int, float):
            kw.update(type=number(tp), metavar=tp.__name__.upper())
        elif _is_mapping(tp):
            kw.update(type=parse_json_object, metavar="JSON")
        elif tp is str:
            kw.update(metavar="STR")
        else:
            raise TypeError(f"cliargs: {cls.__name__}.{f.name}: no option for type {tp}")
        if "choices" in f.metadata:
            kw["choices"] = tuple(f.metadata["choices"])
            kw.pop("metavar", None)
        if "metavar" in f.metadata:
            kw["metavar"] = f.metadata["metavar"]
        target.add_argument(flag(f.name, prefix), **kw)


def values(ns: argparse.Namespace, cls, *, exclude: Iterable[str] = (), dest_prefix: str = "") -> dict:
    """Field -> value of the options of ``cls`` that the command line gave (``add_options`` with the same
    ``exclude`` and ``dest_prefix``); fields not given are absent."""
    out = {}
    for f in _fields(cls, exclude):
        if hasattr(ns, dest_prefix + f.name):
            out[f.name] = getattr(ns, dest_prefix + f.name)
    return out


def build(
    cls, ns: argparse.Namespace, *, exclude: Iterable[str] = (), prefix: str = "", dest_prefix: str = "", **fixed
):
    """``cls(**values(ns, cls), **fixed)``: the dataclass from the options given, ``fixed`` fields set by the caller
    (they win over options). Bad values raise ``CliError`` naming the option: ``--top-k: must be >= 1, got 0``."""
    kw = {**values(ns, cls, exclude=exclude, dest_prefix=dest_prefix), **fixed}
    try:
        return cls(**kw)
    except (TypeError, ValueError) as e:
        raise CliError(option_message(cls, str(e), prefix, skip=fixed)) from None


def option_message(cls, message: str, prefix: str = "", skip: Iterable[str] = ()) -> str:
    """``message`` (a dataclass's validation error) with its field names said as options: ``Cls.top_k: ...`` and
    a leading ``top_k: ...`` become ``--top-k: ...``. Fields in ``skip`` keep their names (no option sets them)."""
    names = {f.name for f in dataclasses.fields(cls)} - set(skip)
    msg = one_line(message)

    def sub(m):
        return flag(m.group(1), prefix) if m.group(1) in names else m.group(0)

    msg = re.sub(rf"\b{re.escape(cls.__name__)}\.(\w+)", sub, msg)
    head, sep, rest = msg.partition(":")
    if sep and head in names:
        msg = flag(head, prefix) + sep + rest
    return msg
