"""Our import names are ours alone (STYLE.md habit 11).

transformers 5.x depends on Hugging Face's ``kernels`` package (the kernel hub); until 2026-12-04 our Triton kernels
were a top-level package of that name too, and whichever came first on ``sys.path`` won: from the repository root
transformers' ``from kernels import CUDAProperties`` found ours. These tests keep any such collision from coming back.
"""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _our_top_level_names() -> set[str]:
    """Every folder at the repository root that Python could import as a package, plus the packages we install."""
    names = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"oasis_core", "oasis_sim", "oasis_exec", "oasis_kernels"} <= names
    return names


def test_no_root_package_shares_a_name_with_another_installed_distribution():
    owners = importlib.metadata.packages_distributions()
    clashes = {
        name: sorted(d for d in owners.get(name, []) if d.lower() != "oasiskv") for name in _our_top_level_names()
    }
    clashes = {k: v for k, v in clashes.items() if v}
    assert not clashes, f"a root package is also installed by another distribution: {clashes}"


def test_transformers_kernel_hub_imports_beside_the_project_from_the_repository_root():
    """What failed in CI: transformers' hub-kernel integration imported from the repository root (where the
    current directory leads ``sys.path``), next to the project's own kernels."""
    pytest.importorskip("transformers")
    code = (
        "import sys, importlib.util\n"
        "import oasis_kernels, oasis_exec, oasis_sim, oasis_core\n"
        "import transformers.integrations.hub_kernels as hub\n"
        "spec = importlib.util.find_spec('kernels')\n"
        "print('kernels-origin', spec.origin if spec else None)\n"
        "print('hub-available', hub.is_kernels_available() if hasattr(hub, 'is_kernels_available') else 'n/a')\n"
        "print('ours', oasis_kernels.__file__)\n"
        "if spec:\n"
        "    from kernels import CUDAProperties  # the import that failed from the root with our package there\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert Path(lines["ours"]).resolve().is_relative_to(ROOT)
    origin = lines["kernels-origin"]
    if origin != "None":  # Hugging Face's kernel hub is installed: it must be theirs, not a folder of this checkout
        assert Path(origin).resolve().parent.parent != ROOT, f"`import kernels` finds the checkout's {origin}"
        from importlib.metadata import distribution

        dist = distribution("kernels")  # the file found is the one the distribution installed
        assert any(Path(dist.locate_file(f)).resolve() == Path(origin).resolve() for f in dist.files or [])
