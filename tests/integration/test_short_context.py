"""Short contexts (issue 15): the shared rule in oasis_core.short_context and the simulator's use of it."""

from dataclasses import replace

import numpy as np
import pytest

from oasis_core.geometry import KVGeometry
from oasis_core.short_context import ShortContext
from oasis_sim.config import ConfigError, SimConfig
from oasis_sim.sim import simulate
from oasis_sim.workloads import uniform_trace

RULE = ShortContext(top_k=16, block_size=16)  # window: 17 blocks = 272 tokens
W = 272
# the roofline prices a sparse mode's layer like dense's; the calibrated predictor charges the sparse engine's own
# fixed costs (oasis_sim.calibrated), which a short request in a sparse mode still pays
FAST = dict(top_k=16, policy_layers=1, profile_steps=8, timeline_steps=5, predictor="roofline")
BPT = KVGeometry(SimConfig().model_spec, 16).bytes_per_token


def run(trace, **kw):
    return simulate(SimConfig(**{**FAST, **kw}), trace)


# -- the rule ----------------------------------------------------------------------------------------------------
def test_window_and_boundaries_on_ints():
    assert RULE.window_tokens == W
    assert RULE.dense(W) and not RULE.dense(W + 1)
    assert not RULE.crossing(W) and RULE.crossing(W + 1) and not RULE.crossing(W + 2)
    assert RULE.offload_tokens(W + 1) == W and RULE.offload_tokens(W) == 0 and RULE.offload_tokens(W + 2) == 0
    assert RULE.host_tokens(W) == 0 and RULE.host_tokens(W + 5) == W + 5
    assert ShortContext(top_k=4, block_size=8, local_blocks=2).window_tokens == 48


def test_arrays_in_arrays_out_numpy_and_torch():
    ctx = np.array([1, W - 1, W, W + 1, W + 2, 10 * W])
    assert RULE.dense(ctx).tolist() == [True, True, True, False, False, False]
    assert RULE.crossing(ctx).tolist() == [False, False, False, True, False, False]
    assert RULE.offload_tokens(ctx).tolist() == [0, 0, 0, W, 0, 0]
    assert RULE.host_tokens(ctx).tolist() == [0, 0, 0, W + 1, W + 2, 10 * W]
    torch = pytest.importorskip("torch")
    t = torch.tensor(ctx)
    assert torch.equal(RULE.offload_tokens(t), torch.tensor(RULE.offload_tokens(ctx)))
    assert torch.equal(RULE.host_tokens(t), torch.tensor(RULE.host_tokens(ctx)))
    assert RULE.dense(t).dtype == torch.bool


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(top_k=-1, block_size=16), "top_k"),
        (dict(top_k=8, block_size=0), "block_size"),
        (dict(top_k=8, block_size=16, local_blocks=1.5), "local_blocks"),
        (dict(top_k=0, block_size=16, local_blocks=0), "top_k"),
    ],
)
def test_bad_rule_names_the_field(kw, field):
    with pytest.raises(ValueError, match=f"ShortContext.{field}"):
        ShortContext(**kw)


def test_config_switch_and_where_it_applies():
    assert SimConfig(mode="lookahead").short_context_rule == ShortContext(top_k=128, block_size=16)
    assert SimConfig(mode="lookahead", short_context=False).short_context_rule is None
    assert SimConfig(mode="dense").short_context_rule is None
    assert SimConfig(mode="lookahead", split="rpf").short_context_rule is None
    with pytest.raises(ConfigError, match="short_context"):
        SimConfig(short_context="yes")


# -- the simulator -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["lookahead", "retrieval"])
def test_short_requests_run_like_dense(mode):
    tr = uniform_trace(6, 200, 40, gap_s=0.002)  # 200 + 40 tokens: within the 272-token window throughout
    dense = run(tr, mode="dense").summary
    on = run(tr, mode=mode).summary
    off = run(tr, mode=mode, short_context=False).summary
    # Without the rule the sparse mode copies every prompt to the host, fetches it back and predicts: slower.
    assert off["h2d_bytes"] > 0 and off["d2h_bytes"] == 6 * 200 * BPT and off["host_peak_bytes"] > 0
    assert off["tpot_ms_p50"] > 1.05 * dense["tpot_ms_p50"]
    # With it: no host copy, no transfer, dense HBM, and dense TPOT within a few %.
    assert on["h2d_bytes"] == 0 and on["d2h_bytes"] == 0 and on["host_peak_bytes"] == 0
    assert on["hbm_peak_bytes"] == dense["hbm_peak_bytes"]
    assert on["tpot_ms_p50"] == pytest.approx(dense["tpot_ms_p50"], rel=0.03)


@pytest.mark.parametrize("event_mode", ["closed", "events"])
def test_crossing_offloads_once_then_runs_sparse(event_mode):
    prompt, out = W - 3, 30  # decode steps attend W-2 .. W+26 tokens: dense for 3 steps, crossing at W+1
    res = run(uniform_trace(1, prompt, out), mode="lookahead", event_mode=event_mode)
    s = res.summary
    assert s["d2h_bytes"] == W * BPT  # the KV so far (W tokens), copied once; the prompt was never offloaded
    assert s["h2d_bytes"] > 0  # sparse after the crossing: it fetches
    assert s["host_peak_bytes"] == -(-(prompt + out) // 16) * 16 * BPT
    hbm = [b for _, b in res.memory["decode.hbm"]]
    assert hbm[0] == W * BPT  # while dense: its 17 blocks of KV, no summaries, no draft state
    geo = KVGeometry(SimConfig().model_spec, 16)
    sparse = (
        geo.resident_bytes(16)
        + 18 * geo.rows_per_request * geo.summary_bytes_per_block_head
        + SimConfig().draft_state_bytes
    )
    assert hbm[1] == sparse  # from the crossing (273 tokens, 18 blocks): the sparse holdings


def test_crossing_step_waits_for_its_copy(monkeypatch):
    # A crossing request's step lasts at least its copy to the host; a copy path 1000x slower makes that visible.
    from oasis_core import specs

    tr = uniform_trace(1, W - 1, 4)  # steps: prefill, decode at W, decode at W+1 (the crossing), W+2, W+3
    fast = run(tr, mode="lookahead")
    hw = SimConfig().hardware_spec
    slow_Bps = hw.d2h_bytes_per_s / 1000
    monkeypatch.setitem(specs.HARDWARE, SimConfig().hardware, replace(hw, measured_d2h_bytes_per_s=slow_Bps))
    slowed = run(tr, mode="lookahead")
    copy_s = W * BPT / slow_Bps
    i = 2
    assert fast.steps.dur[i] < copy_s <= slowed.steps.dur[i] < copy_s + 0.01
    assert fast.steps.stall[i] == 0 and slowed.steps.stall[i] > 0
    assert slowed.steps.dur[:i] == fast.steps.dur[:i]
    assert slowed.steps.dur[i + 1] == pytest.approx(fast.steps.dur[i + 1])
