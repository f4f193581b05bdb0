"""Bounded echoes of user input in error messages.

Every message that quotes a value a user supplied (a config field, a grid entry, an option, a request field)
quotes it through ``show``: a few hundred characters at most, built without formatting the whole value (a list of a
billion items, or a YAML alias bomb's shared sub-lists, costs a few hundred operations). ``clip`` bounds a
finished message (``one_line`` in ``oasis_core.cliargs`` applies it to every CLI error line).
"""

from __future__ import annotations

import reprlib

SHOW_LIMIT = 80  # characters of one echoed value
TEXT_LIMIT = 300  # characters of one echoed string (a path, an option's text)
LINE_LIMIT = 1000  # characters of one error line

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = _repr.maxfrozenset = _repr.maxdeque = 4
_repr.maxstring = TEXT_LIMIT
_repr.maxother = SHOW_LIMIT
_repr.maxlong = 40


def show(value, limit: int | None = None) -> str:
    """``repr(value)`` cut to ``limit`` characters (default ``TEXT_LIMIT`` for a string, ``SHOW_LIMIT`` for any
    other value; ``...`` marks the cut), in time bounded by the limits above."""
    if limit is None:
        limit = TEXT_LIMIT + 2 if isinstance(value, str) else SHOW_LIMIT
    try:
        text = _repr.repr(value)
    except Exception:  # noqa: BLE001 - a value whose own __repr__ fails is still named
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clip(text: str, limit: int = LINE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, the cut said (``... [N more characters]``)."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"
