"""The tutorial of docs/policies.md, step by step, on the CPU: its policy (docs/examples/churn_cap.py) loads through
$OASIS_POLICY_MODULES, its check script passes and numpy == torch without host reads, it runs in a tiny simulator
run, in the sweep grid's workers, in a CPU executor engine and in a ``bench`` process, the comparison script pairs a
bench record with its replay, and every example file is shown verbatim in the doc."""

import contextlib
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from exec_cases import cfg, prompts

from oasis_core.fetchcap import POLICY_MODULES_ENV, CapContext, get_policy, load_policy_modules, state_array
from oasis_core.recording import load_recording
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams
from oasis_sim.cli import main as sim_main
from oasis_sim.replay import replay
from oasis_sim.sweep import load_grid

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
POLICY_FILE = "docs/examples/churn_cap.py"
QUICK = ["--max-requests", "4", "--top-k", "16", "--policy-layers", "2", "--profile-steps", "4", "--quiet"]
TINY_BENCH = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--top-k", "4", "--selection", "synthetic"]
TINY_BENCH += ["--context", "256", "--steps", "8", "--warmup", "2", "--concurrency", "2", "--record-hardware", "h200"]


@pytest.fixture(scope="module", autouse=True)
def policy_env():
    """The tutorial's setting: the variable names the file by its path from the repository root."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(POLICY_MODULES_ENV, POLICY_FILE)
        mp.chdir(ROOT)
        load_policy_modules()
        yield


def _env(**kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **kw}
    return {k: v for k, v in env.items() if v is not None}


def test_the_policy_loads_by_its_path_and_round_trips():
    p = get_policy("churn:2,alpha=0.5,min_ratio=0")
    assert type(p).__name__ == "ChurnCap" and type(p).__module__ == "churn_cap"
    assert sys.modules["churn_cap"].__file__ == str(ROOT / POLICY_FILE)
    assert get_policy(p.spec) == p and p.spec == "churn:2,alpha=0.5,min_ratio=0"
    assert get_policy("churn").spec == "churn:1.5" and get_policy("churn").max_cap(128) == 32
    for bad in ("churn:0", "churn:1,alpha=0", "churn:1,min_ratio=0.5,max_ratio=0.2", "churn:x"):
        with pytest.raises(ValueError, match=re.escape(f"fetch cap {bad!r}: ChurnCap")):
            get_policy(bad)


def test_the_docs_check_script_passes(capsys):
    runpy.run_path(str(EXAMPLES / "check_churn_cap.py"), run_name="__main__")
    assert capsys.readouterr().out == "ChurnCap: ok\n"


@contextlib.contextmanager
def _no_host_reads():
    """Every way a tensor's value reaches the host raises (the CPU stand-in for CUDA's sync debug mode)."""
    names = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
    saved = {k: getattr(torch.Tensor, k) for k in names}

    def boom(*a, **k):
        raise AssertionError("host read of a tensor value")

    try:
        for k in names:
            setattr(torch.Tensor, k, boom)
        yield
    finally:
        for k, v in saved.items():
            setattr(torch.Tensor, k, v)


@pytest.mark.parametrize("spec", ["churn", "churn:0.7,alpha=1,min_ratio=0", "churn:3,alpha=0.05,max_ratio=1"])
def test_numpy_equals_torch_without_host_reads_and_caps_stay_in_bounds(spec):
    p = get_policy(spec)
    rng = np.random.default_rng(3)
    K, R = 64, 24
    lo, hi = p.max_cap(K), 0
    s_np = state_array(p.row_state_init(K), R)
    s_t = state_array(p.row_state_init(K), R, like=torch.empty(0))
    for step in range(40):
        n = rng.integers(0, K + 1, size=R) * (rng.random(R) < 0.7)  # some rows miss nothing
        want = p.cap(CapContext(step=step, top_k=K, rows=R, n_missing=n, row_state=s_np))
        with _no_host_reads():
            got = p.cap(CapContext(step=step, top_k=K, rows=R, n_missing=torch.from_numpy(n), row_state=s_t))
        assert got.dtype == torch.int64 and got.tolist() == want.tolist(), step
        assert np.array_equal(s_t.numpy(), s_np)
        assert want.min() >= 0 and want.max() <= p.max_cap(K)
        lo, hi = min(lo, int(want.min())), max(hi, int(want.max()))
    assert lo < hi  # the cap does adapt over these inputs


def test_a_tiny_simulator_run_against_fixed(tmp_path):
    got = {}
    for spec in ("fixed:0.05", "churn:1"):
        out = tmp_path / spec.replace(":", "_")
        args = ["run", "--out", str(out), *QUICK, "--concurrency", "4", "--policy-sampling", "exact"]
        assert sim_main([*args, "--fetch-policy", spec]) == 0
        got[spec] = json.loads((out / "summary.json").read_text())
    s = got["churn:1"]
    assert s["fetch_policy"] == "churn:1" and s["requests_completed"] == 4 and s["h2d_bytes_per_step"] > 0
    assert s["h2d_bytes"] != got["fixed:0.05"]["h2d_bytes"]  # the cap changed what moved


def test_the_sweep_grid_is_valid_and_its_policies_reach_a_fresh_sweep_and_its_workers(tmp_path):
    _trace, points, _workers = load_grid(str(EXAMPLES / "churn_sweep.yaml"))
    assert [p["fetch_policy"] for p, _ in points] == ["fixed:0.05", "churn:0.5", "churn:1", "churn:1.5", "unlimited"]
    assert {v["policy_sampling"] for _, v in points} == {"exact"}
    # The same grid, tiny, in a fresh process with two workers: only the variable tells them about 'churn'.
    grid = tmp_path / "g.yaml"
    base = "{policy_sampling: exact, concurrency: 2, max_requests: 2, top_k: 16, policy_layers: 1, profile_steps: 4}"
    grid.write_text(f"base: {base}\ngrid:\n  fetch_policy: [churn:0.5, churn:2]\n")
    cmd = [sys.executable, "-m", "oasis_sim", "sweep", str(grid), "--out", str(tmp_path / "o"), "--workers", "2"]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    import pandas as pd

    rows = pd.read_csv(tmp_path / "o" / "sweep.csv")
    assert list(rows["fetch_policy"]) == ["churn:0.5", "churn:2"] and rows["error"].isna().all()
    p = subprocess.run(cmd, cwd=ROOT, env=_env(**{POLICY_MODULES_ENV: None}), capture_output=True, text=True)
    assert p.returncode == 2 and "unknown policy 'churn'" in p.stderr and POLICY_MODULES_ENV in p.stderr


@pytest.mark.usefixtures("one_torch_thread")
def test_a_tiny_cpu_executor_engine_runs_it():
    spec = "churn:1,min_ratio=0,max_ratio=1"  # K = 3: caps 0 .. 3
    eng = Engine(cfg("lookahead", top_k=3, max_context=400, max_lanes=2, fetch_policy=spec))
    caps = eng.runner.caps
    assert caps.adaptive and caps.max_cap == 3
    seen, cap = [], caps.cap
    caps.cap = lambda layer, resident, pred, rows=None: seen.append(cap(layer, resident, pred, rows)) or seen[-1]
    for p in prompts(4, (40, 65, 50)):
        eng.add_request(p, SamplingParams(max_tokens=30))
    while eng.has_work():
        eng.step()
    assert len(seen) > 50 and all(isinstance(c, torch.Tensor) for c in seen)
    allc = torch.cat(seen)
    assert int(allc.min()) >= 0 and int(allc.max()) <= caps.max_cap and len(allc.unique()) > 1
    assert caps.row_state.shape[0] == eng.runner.L and float(caps.row_state.sum()) > 0  # the moving averages
    assert eng.runner.counters()["units_fetched"] > 0
    eng.close()


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """``python -m oasis_exec bench ... --fetch-policy churn:0.5`` in a fresh process: its record and recording."""
    d = tmp_path_factory.mktemp("bench")
    out, rec = d / "bench.jsonl", d / "churn.rec.json"
    cmd = [sys.executable, "-m", "oasis_exec", "bench", *TINY_BENCH, "--fetch-policy", "churn:0.5"]
    cmd += ["--out", str(out), "--record", str(rec)]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(out.read_text().splitlines()[-1]), out, rec


def test_a_bench_process_finds_the_policy_through_the_variable(bench_run):
    record, _out, _rec = bench_run
    assert record["fetch_policy"] == "churn:0.5" and record["bytes_moved_per_step"] > 0
    cmd = [sys.executable, "-m", "oasis_exec", "bench", *TINY_BENCH, "--fetch-policy", "churn:0.5"]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(**{POLICY_MODULES_ENV: None}), capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "unknown policy 'churn'" in p.stderr and POLICY_MODULES_ENV in p.stderr


def test_a_replay_runs_the_recorded_policy_and_config_overrides_it(bench_run):
    rec = load_recording(bench_run[2])
    assert rec.config["fetch_policy"] == "churn:0.5" and rec.config["fetch_ratio"] == 0.05
    churn = replay(rec)  # the recorded policy, with exact plans (it is adaptive)
    none = replay(rec, config={"fetch_policy": "fixed:0"})  # config= overrides it: a cap of 0 fetches nothing
    assert churn.cfg.fetch_policy == "churn:0.5" and churn.cfg.policy_sampling == "exact"
    assert churn.sim.summary["fetch_policy"] == "churn:0.5" and none.cfg.fetch_policy == "fixed:0"
    assert churn.predicted["pcie_h2d_bytes_per_step"] > 0 == none.predicted["pcie_h2d_bytes_per_step"]


def test_the_comparison_script_pairs_the_record_with_its_replay(bench_run, capsys):
    record, out, rec = bench_run
    mod = runpy.run_path(str(EXAMPLES / "compare_backends.py"))
    mod["main"](str(out), str(rec))
    text = capsys.readouterr().out
    assert text.startswith("churn:0.5: 2 x 256 tokens, lookahead, bench on cpu\n")
    bytes_row = next(line for line in text.splitlines() if "host->GPU bytes/step" in line).split()
    assert bytes_row[-2] == f"{record['bytes_moved_per_step']:,.4g}"
    want = replay(load_recording(rec), config={"fetch_policy": "churn:0.5", "policy_sampling": "exact"})
    assert bytes_row[-1] == f"{want.predicted['pcie_h2d_bytes_per_step']:,.4g}"
    assert "resident recall" in text and "drift blocks/step" in text
    with pytest.raises(SystemExit, match="1 records, but 2 recordings"):
        mod["main"](str(out), str(rec), str(rec))


def test_every_example_file_is_in_the_doc_verbatim():
    doc = (ROOT / "docs" / "policies.md").read_text()
    blocks = re.findall(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)^```$", doc, flags=re.S | re.M)
    shown = {path for path, _ in blocks}
    assert shown == {f"docs/examples/{f.name}" for f in EXAMPLES.iterdir() if f.is_file()}
    for path, text in blocks:
        assert text == (ROOT / path).read_text(), f"docs/policies.md: the block of {path} is not the file"
