"""No mode-name comparison outside ``oasis_core/modes.py``: callers ask the registry (``modes.get(name).sparse``, ...).

The check walks the syntax tree of every module of the packages and flags a comparison (``==``, ``!=``, ``in``,
``not in``) with a mode name as an operand (a string literal, or a tuple / list / set holding one) or with a
mode-name tuple of the registry (``SPARSE_MODES``, ``BACKGROUND_MODES``, ...). Mode names used as data (CLI choices,
JSON keys, loops over the names) are not comparisons and pass.
"""

import ast
from pathlib import Path

import pytest

from oasis_core import modes

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("oasis_core", "oasis_exec", "oasis_sim", "oasis_kernels")
REGISTRY_FILE = ROOT / "oasis_core" / "modes.py"
NAME_TUPLES = {"MODES", "SPARSE_MODES", "BACKGROUND_MODES", "DENSE_FAMILY"}


def _names_a_mode(node) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in modes.REGISTRY
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_mode(e) for e in node.elts)
    if isinstance(node, ast.Name):
        return node.id in NAME_TUPLES
    if isinstance(node, ast.Attribute):
        return node.attr in NAME_TUPLES
    return False


def mode_comparisons(source: str):
    """(line, text) of each comparison of a mode name in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_names_a_mode(x) for x in (node.left, *node.comparators)):
            out.append((node.lineno, ast.get_source_segment(source, node)))
    return out


def test_the_check_flags_comparisons_and_passes_data():
    src = (
        'a = mode == "lookahead"\nb = m in ("proxy", "lookahead")\nc = cfg.mode not in SPARSE_MODES\n'
        'd = "dense" != x\ne = {"dense": 1}\nf = ("dense", "quest")\ng = x == "sparse"\n'
        'for m in ("quest", "retrieval"):\n    pass\n'
    )
    assert [ln for ln, _ in mode_comparisons(src)] == [1, 2, 3, 4]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_mode_name_comparison_outside_the_registry(package):
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path == REGISTRY_FILE:
            continue
        for line, text in mode_comparisons(path.read_text()):
            found.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not found, "compare a Mode's properties (oasis_core.modes.get(name)), not its name:\n" + "\n".join(found)
