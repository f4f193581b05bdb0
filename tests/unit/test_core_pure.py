"""oasis_core must import and work with torch, simpy and triton unavailable (DESIGN.md: numpy only at import time).

The check runs in a fresh interpreter, where ``sys.modules[name] = None`` makes any ``import name`` fail.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib, json, pkgutil, sys
for name in ("torch", "simpy", "triton"):
    sys.modules[name] = None  # any import of these now raises ImportError

import oasis_core
submodules = sorted(m.name for m in pkgutil.walk_packages(oasis_core.__path__, "oasis_core."))
for name in submodules:
    importlib.import_module(name)

import numpy as np
from oasis_core.geometry import KVGeometry
from oasis_core.specs import get_model
from oasis_core.trace import load_trace
from oasis_core.xp import namespace

g = KVGeometry(get_model("qwen3-8b"))
trace = load_trace(sys.argv[1])
xp = namespace(np.array([3, 1, 2]))
order = xp.argsort_desc(np.array([3, 1, 2])).tolist()
print(json.dumps({
    "submodules": submodules,
    "bytes_per_token": g.bytes_per_token,
    "n_requests": len(trace.requests),
    "order": order,
    "xp": xp.name,
    "blocked_still_blocked": all(sys.modules[n] is None for n in ("torch", "simpy", "triton")),
    "heavy_loaded": sorted(n for n in ("pandas", "scipy", "matplotlib") if n in sys.modules),
}))
"""


def test_oasis_core_imports_and_runs_without_torch_simpy_triton():
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO / "traces" / "mooncake_slice.json")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in (
        "oasis_core.specs",
        "oasis_core.geometry",
        "oasis_core.trace",
        "oasis_core.importers",
        "oasis_core.xp",
    ):
        assert name in out["submodules"]
    assert out["bytes_per_token"] == 147_456
    assert out["n_requests"] == 200
    assert (out["xp"], out["order"]) == ("numpy", [0, 2, 1])
    assert out["blocked_still_blocked"] is True
    assert out["heavy_loaded"] == []  # pandas is imported only inside import_azure
