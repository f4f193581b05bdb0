"""The decode path's size bounds (issue 34; docs/structures.md, "A decode step's mode families"), read from the
syntax trees of engine/, runner/, workingset/, transfer/ and kv/: no function longer than 80 lines, no class holding
more than 20 attributes (``self.x`` stores and class-level annotations); and every mode has a working-set family."""

from __future__ import annotations

import ast
from pathlib import Path

from oasis_core import modes

ROOT = Path(__file__).resolve().parents[2]
DECODE_PATH = ("engine", "runner", "workingset", "transfer", "kv")


def _classes_and_functions():
    for d in DECODE_PATH:
        for p in sorted((ROOT / "oasis_exec" / d).rglob("*.py")):
            tree = ast.parse(p.read_text())
            for node in ast.walk(tree):
                yield p.relative_to(ROOT), node


def _attributes(cls: ast.ClassDef) -> set:
    names = {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    for m in ast.walk(cls):
        if isinstance(m, ast.Attribute) and isinstance(m.ctx, ast.Store):
            if isinstance(m.value, ast.Name) and m.value.id == "self":
                names.add(m.attr)
    return names


def test_no_decode_path_function_over_80_lines():
    long = [
        f"{p}:{n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for p, n in _classes_and_functions()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 80
    ]
    assert not long, long


def test_no_decode_path_class_over_20_attributes():
    big = [
        f"{p}:{n.name} ({len(_attributes(n))}: {sorted(_attributes(n))})"
        for p, n in _classes_and_functions()
        if isinstance(n, ast.ClassDef) and len(_attributes(n)) > 20
    ]
    assert not big, big


def test_every_mode_has_a_working_set_family():
    from oasis_exec.workingset.families import FAMILIES

    for name in modes.MODES:
        assert modes.get(name).set_family in FAMILIES, name
