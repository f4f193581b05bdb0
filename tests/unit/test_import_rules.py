"""The import rules of the layout (docs/structures.md, "Why the layout is the way it is"), read from the source's
syntax trees, every import statement counted (module level or inside a function), those under ``if TYPE_CHECKING:``
excepted (annotations only, never run):

- no import loop among the modules of a package;
- the simulator imports nothing from the executor;
- the executor's runtime (everything but ``tools/`` and the ``__main__`` entry points) imports no tool;
- one function stamps provenance: no ``git rev-parse`` outside ``oasis_core/provenance.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("oasis_core", "oasis_sim", "oasis_exec", "oasis_kernels")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def _targets(mod: str, is_pkg: bool, node, mods) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.split(".") if is_pkg else mod.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module
        names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in mods else stem for a in node.names]
    out = []
    for n in names:  # the module itself, or the nearest package above a name it exports
        while n and n not in mods:
            n = n.rpartition(".")[0]
        if n:
            out.append(n)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the four packages it imports."""
    mods = _modules()
    graph = {}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_only(tree)
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                edges.update(_targets(mod, path.name == "__init__.py", node, mods))
        edges.discard(mod)
        graph[mod] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


GRAPH = import_graph()


def test_the_checker_sees_a_loop_and_a_type_only_import():
    g = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert cycles(g) == [["a.x", "a.y", "a.z"]]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import os\nimport sys\n")
    skip = _type_checking_only(tree)
    kept = [n for n in ast.walk(tree) if isinstance(n, ast.Import) and id(n) not in skip]
    assert [a.name for n in kept for a in n.names] == ["sys"]
    # a real edge of the tree, in a function body: the engine imports the runner
    assert "oasis_exec.runner.runner" in GRAPH["oasis_exec.engine.engine"]


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_import_loop_in_a_package(pkg):
    sub = {m: {t for t in e if t.split(".")[0] == pkg} for m, e in GRAPH.items() if m.split(".")[0] == pkg}
    assert cycles(sub) == []


def test_the_simulator_imports_nothing_of_the_executor():
    bad = {m: sorted(t for t in e if t.startswith("oasis_exec")) for m, e in GRAPH.items() if m.startswith("oasis_sim")}
    assert {m: t for m, t in bad.items() if t} == {}


def _is_tool(mod: str) -> bool:
    return mod.startswith("oasis_exec.tools")


def test_the_executors_runtime_imports_no_tool():
    runtime = [m for m in GRAPH if m.startswith("oasis_exec") and not _is_tool(m) and not m.endswith("__main__")]
    assert len(runtime) > 20
    bad = {m: sorted(t for t in GRAPH[m] if _is_tool(t)) for m in runtime}
    assert {m: t for m, t in bad.items() if t} == {}


def test_the_core_imports_no_other_package():
    bad = {
        m: sorted(t for t in e if not t.startswith("oasis_core"))
        for m, e in GRAPH.items()
        if m.startswith("oasis_core")
    }
    assert {m: t for m, t in bad.items() if t} == {}


def test_one_function_stamps_provenance():
    files = [p for pkg in (*PACKAGES, "experiments") for p in (ROOT / pkg).rglob("*.py")]
    stamping = sorted(str(p.relative_to(ROOT)) for p in files if '"rev-parse"' in p.read_text(encoding="utf-8"))
    assert stamping == ["oasis_core/provenance.py"]
