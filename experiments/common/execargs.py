"""``FIELD=VALUE`` items of the experiments' ``--exec`` options (and h200_headline's ``set=`` variants) as
``ExecConfig`` fields: each value read as JSON, else kept as text; an unknown field fails at once, not mid-sweep."""

from __future__ import annotations

import dataclasses
import json


def exec_fields(items) -> dict:
    from oasis_exec.config import ExecConfig

    names = {f.name for f in dataclasses.fields(ExecConfig)}
    out = {}
    for it in items or ():
        k, sep, v = it.partition("=")
        if not sep or k not in names:
            raise ValueError(f"--exec / set=: want FIELD=VALUE with an ExecConfig field, got {it!r}")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out
