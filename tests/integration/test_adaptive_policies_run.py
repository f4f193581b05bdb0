"""Each adaptive policy (drift, per-layer, recall) runs end to end in both backends: a tiny simulator run
(``policy_sampling=exact``) and a CPU executor run (tiny dummy model), with the policy state carried by the
backend (oasis_sim.policy.PolicyRunner, oasis_exec.workingset.fetch_caps.DeviceCaps)."""

import json

import numpy as np
import pytest
import torch
from exec_cases import cfg, prompts

from oasis_core.fetchcap import get_policy
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams
from oasis_exec.workingset.fetch_caps import DeviceCaps
from oasis_sim.cli import main
from oasis_sim.config import SimConfig
from oasis_sim.policy import PolicyRunner

SPECS = ["drift:alpha=0.5", "per-layer:0.1", "recall:0.9"]
QUICK = ["--max-requests", "4", "--top-k", "16", "--policy-layers", "2", "--profile-steps", "4", "--quiet"]


@pytest.mark.parametrize("spec", SPECS)
def test_simulator_runs_each_policy(tmp_path, spec):
    out = tmp_path / "o"
    args = ["run", "--out", str(out), *QUICK, "--concurrency", "4", "--policy-sampling", "exact", "--fetch-policy"]
    assert main([*args, spec]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["fetch_policy"] == get_policy(spec).spec and s["requests_completed"] == 4
    assert s["h2d_bytes_per_step"] > 0


@pytest.mark.parametrize("spec", SPECS)
def test_simulator_runner_carries_the_state(spec):
    run = PolicyRunner(SimConfig(policy_sampling="exact", fetch_policy=spec, top_k=16, policy_layers=2), [200], 0)
    assert run.layers == 2 and run.rows == 2 * run.kvh
    before = [None if a is None else a.copy() for a in (run.row_state, run.layer_state)]
    for _ in range(5):
        f, m, _, _ = run.step()
        assert (f <= run.max_cap).all() and (f <= np.maximum(m, 0)).all()
    after = (run.row_state, run.layer_state)
    changed = [not np.array_equal(a, b) for a, b in zip(before, after) if a is not None]
    assert changed == ([] if spec.startswith("recall") else [True])


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("spec", SPECS)
def test_executor_cpu_runs_each_policy(spec):
    eng = Engine(cfg("lookahead", top_k=3, fetch_ratio=0.67, max_context=400, max_lanes=2, fetch_policy=spec))
    caps = eng.runner.caps
    assert caps.adaptive and caps.fixed is None
    seen = []
    cap = caps.cap

    def spy(layer, resident, pred, rows=None):
        c = cap(layer, resident, pred, rows)
        seen.append(c)
        return c

    caps.cap = spy
    for p in prompts(4, (40, 65, 50)):
        eng.add_request(p, SamplingParams(max_tokens=30))
    while eng.has_work():
        eng.step()
    tensors = [c for c in seen if isinstance(c, torch.Tensor)]
    assert len(tensors) > 50 and len(tensors) == len(seen)
    allc = torch.cat(tensors)
    assert int(allc.min()) >= 0 and int(allc.max()) <= caps.max_cap
    assert eng.runner.counters()["units_fetched"] > 0
    if spec.startswith("drift"):
        assert caps.row_state is not None and caps.row_state.shape[0] == eng.runner.L
    if spec.startswith("per-layer"):
        assert caps.layer_state.shape == (eng.runner.L, 1) and float(caps.layer_state.sum()) > 0
    eng.close()


def test_device_caps_key_row_state_by_store_rows():
    """With row ids the state of a row follows it wherever it sits in the call; without, the call's positions."""
    p = get_policy("drift:alpha=1")
    caps = DeviceCaps(
        policy=p,
        top_k=100,
        n_layers=2,
        bytes_per_block_head=1,
        link_bytes_per_s=1.0,
        device=torch.device("cpu"),
        state_rows=4,
    )
    start = caps.row_state[0, 0, 1].item()
    res = torch.full((2, 4), -1, dtype=torch.int64)
    pred = torch.tensor([[0, 1, 2, 3], [-1, -1, -1, -1]])  # row 3 misses everything, row 1 nothing
    c = caps.cap(1, res, pred, rows=torch.tensor([3, 1]))
    assert c.tolist() == [int(2 * start), int(start) - 1]  # ema 1 > high: doubles; ema 0 < low: shrinks
    assert caps.row_state[1, :, 1].tolist() == [start, start - 1, start, 2 * start]
    assert caps.row_state[0].tolist() == [[0.0, start]] * 4  # layer 0 untouched
    caps.cap(0, res, pred)  # no row ids: rows 0 and 1 of layer 0
    assert caps.row_state[0, :, 1].tolist() == [2 * start, start - 1, start, start]


def test_device_caps_reset_rows_starts_a_new_request_afresh():
    """A lane reused by a new request: its rows' drift state returns to the policy's initial state; other rows keep
    theirs (the runner calls this at admission)."""
    caps = DeviceCaps(
        policy=get_policy("drift:alpha=1"),
        top_k=100,
        n_layers=2,
        bytes_per_block_head=1,
        link_bytes_per_s=1.0,
        device=torch.device("cpu"),
        state_rows=4,
    )
    init = caps.row_state.clone()
    res = torch.full((4, 4), -1, dtype=torch.int64)
    pred = torch.tensor([[0, 1, 2, 3]] * 4)  # every row misses everything: every cap grows
    for layer in (0, 1):
        caps.cap(layer, res, pred, rows=torch.arange(4))
    grown = caps.row_state.clone()
    assert not torch.equal(grown, init)
    caps.reset_rows(slice(2, 4))
    assert torch.equal(caps.row_state[:, 2:], init[:, 2:]) and torch.equal(caps.row_state[:, :2], grown[:, :2])


def test_runner_resets_the_lane_rows_at_admission():
    eng = Engine(cfg("lookahead", top_k=3, fetch_ratio=0.67, max_context=400, max_lanes=1, fetch_policy="drift"))
    caps, calls = eng.runner.caps, []
    reset = caps.reset_rows
    caps.reset_rows = lambda rows: (calls.append(rows), reset(rows))
    for p in prompts(2, (40, 50)):  # one lane, two requests: it is reused
        eng.add_request(p, SamplingParams(max_tokens=8))
    while eng.has_work():
        eng.step()
    H = eng.runner.H
    assert calls == [slice(0, H), slice(0, H)]
    eng.close()
