"""The ``quality`` command: each module that measures something adds its subcommand here."""

from __future__ import annotations

import importlib

SUBCOMMANDS = ("selection", "endtoend", "taskrun")  # modules of this package with add_command(subparsers)


def add_quality_command(sub) -> None:
    q = sub.add_parser("quality", help="selection and end-to-end quality of the sparse modes on a real model")
    qs = q.add_subparsers(dest="quality_cmd", required=True)
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f"oasis_exec.tools.quality.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"oasis_exec.tools.quality.{name}":
                raise
            continue
        mod.add_command(qs)
