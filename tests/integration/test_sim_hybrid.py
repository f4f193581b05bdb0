"""Hybrid attention in the simulator (issue 36): windowed layers hold a ring of W tokens on the GPU and attend it
densely; only full layers have the host copy, summaries, selection and transfers. Exact figures by hand for
Gemma 3 270M (3 full layers of 1 KV head x 256 dims, 15 windows of 512 tokens, bf16)."""

import json
from dataclasses import replace

import pytest
import simpy

from oasis_core import specs
from oasis_core.geometry import KVGeometry
from oasis_sim.config import ConfigError, SimConfig
from oasis_sim.hardware import MemoryPool
from oasis_sim.layer_kinds import LayerKinds
from oasis_sim.pipeline import LayerPipeline
from oasis_sim.predictor import RooflinePredictor
from oasis_sim.scheduler import ByteAccounting, Req, SimScheduler
from oasis_sim.sim import simulate
from oasis_sim.workloads import uniform_trace
from tests.helpers.sim_cases import QUICK, run_outputs

G = "gemma3-270m"
FAST = dict(
    model=G, hardware="h200", top_k=16, policy_layers=1, profile_steps=8, timeline_steps=0, predictor="roofline"
)  # exact roofline sums below
TOKEN_FULL = 3 * 2 * 1 * 256 * 2  # K and V of a token on the 3 full layers: 3,072 B
TOKEN_LAYER = 2 * 1 * 256 * 2  # one layer: 1,024 B
WINDOWS = 15 * 512 * TOKEN_LAYER  # 7,864,320 B: the 15 rings of 512 tokens
BLOCK_HEAD = 2 * 16 * 256 * 2  # a (block, head) slice: 16,384 B
ROWS = 3 * 1  # full layers x KV heads
RESIDENT_16 = (16 + 1) * ROWS * BLOCK_HEAD  # top_k 16 + the local block: 835,584 B
SUMMARY = 2 * 256 * 2  # a block's min and max keys, one head: 1,024 B
DRAFT = 2 * 2**20


def run(trace, **kw):
    return simulate(SimConfig(**{**FAST, **kw}), trace)


def full_twin():
    """Gemma's three full layers alone: a model without windows whose every layer is one of Gemma's full ones."""
    return replace(specs.get_model(G), name="gemma-full-twin", n_layers=3, layer_windows=())


def test_geometry_by_hand():
    geo = KVGeometry(specs.get_model(G), 16)
    assert geo.full_bytes_per_token == TOKEN_FULL and geo.rows_per_request == ROWS
    assert geo.window_bytes(100) == 15 * 100 * TOKEN_LAYER and geo.window_bytes(4096) == WINDOWS
    assert geo.dense_bytes(32768) == 32768 * TOKEN_FULL + WINDOWS  # the 100 MB + 7.9 MB
    assert geo.resident_bytes(16) == RESIDENT_16
    assert geo.summary_bytes(2000) == 125 * ROWS * SUMMARY
    assert geo.host_bytes_per_block() == 16 * TOKEN_FULL and geo.host_bytes_per_token() == TOKEN_FULL
    assert geo.m_kv(4, 1000) == 4 * (1000 * TOKEN_FULL + 15 * 512 * TOKEN_LAYER)


def test_byte_accounting_by_hand():
    env = simpy.Environment()
    cfg = SimConfig(**FAST, mode="lookahead")
    geo = KVGeometry(cfg.model_spec, 16)
    acct = ByteAccounting(cfg, geo, MemoryPool(env, 1e12, "hbm"), MemoryPool(env, 1e12, "host"))
    r = Req(0, 0.0, 8192, 8)
    # sparse, after prefill: resident set + draft + summaries of 512 blocks + the windows; host: the full layers
    assert acct.need(r, 8192, staging=False) == (
        RESIDENT_16 + DRAFT + 512 * ROWS * SUMMARY + WINDOWS,
        8192 * TOKEN_FULL,
    )
    # while prefilling: plus the full layers' KV staged for the offload (the windows are already counted)
    assert acct.need(r, 8192, staging=True)[0] == RESIDENT_16 + DRAFT + 512 * ROWS * SUMMARY + WINDOWS + 8192 * 3072
    # a short request (within the 272-token resident set): dense, its tokens on every layer (all < W)
    assert acct.need(r, 200, staging=False) == (208 * (TOKEN_FULL + 15 * TOKEN_LAYER), 0.0)
    dense = ByteAccounting(SimConfig(**FAST, mode="dense"), geo, MemoryPool(env, 1, "h"), MemoryPool(env, 1, "x"))
    assert dense.need(r, 8193, staging=False) == (8208 * TOKEN_FULL + WINDOWS, 0.0)


def test_lane_counts_by_hand():
    """How many 8K-token requests the scheduler admits into a pool sized for exactly 10 of them, dense: the windows
    are a fixed 7.9 MB, not 15 x 8K tokens."""
    per = 8192 * TOKEN_FULL + WINDOWS  # 33,030,144 B at admission
    for pool, lanes in ((10 * per, 10), (10 * per - 1, 9)):
        env = simpy.Environment()
        cfg = SimConfig(**FAST, mode="dense", max_batch=64)
        sched = SimScheduler(cfg, KVGeometry(cfg.model_spec, 16), MemoryPool(env, pool, "h"), MemoryPool(env, 1, "x"))
        for i in range(20):
            sched.add(Req(i, 0.0, 8192, 8), 0.0)
        plan = sched.schedule(0.0)
        assert len(plan.admitted) == lanes
    # an all-full model of the same shape would fit 10 x 33.0 MB / (8192 x 18 layers x 1 KB) = 2 of them
    assert int(10 * per // (8192 * 18 * TOKEN_LAYER)) == 2


def test_a_request_in_a_sparse_mode_by_hand():
    prompt, out = 2000, 30  # sparse from its prefill (> 272 tokens); 125 blocks after prefill, 127 at its end
    res = run(uniform_trace(1, prompt, out), mode="lookahead")
    s = res.summary
    hbm = [b for _, b in res.memory["decode.hbm"]]
    fixed = RESIDENT_16 + DRAFT + WINDOWS
    assert hbm[0] == fixed + 125 * ROWS * SUMMARY + 2000 * TOKEN_FULL  # staging the prefill's full layers
    assert hbm[1] == fixed + 126 * ROWS * SUMMARY  # the first decode step (2,001 tokens: 126 blocks)
    assert s["host_peak_bytes"] == 127 * 16 * TOKEN_FULL  # the full layers only
    assert s["d2h_bytes"] == 2000 * TOKEN_FULL  # the prompt's offload: full layers only
    assert s["full_layers"] == [5, 11, 17] and s["window_kv_bytes"] == WINDOWS
    assert s["layer_windows"] == [None if l in (5, 11, 17) else 512 for l in range(18)]


def test_dense_hbm_by_hand():
    s = run(uniform_trace(1, 2000, 30), mode="dense").summary
    assert s["hbm_peak_bytes"] == 2032 * TOKEN_FULL + WINDOWS
    s = run(uniform_trace(1, 300, 4), mode="dense").summary  # 304 tokens: every window holds them all
    assert s["hbm_peak_bytes"] == 304 * (TOKEN_FULL + 15 * TOKEN_LAYER)


@pytest.mark.parametrize("mode", ["lookahead", "retrieval"])
def test_bytes_per_step_are_those_of_the_full_layers_alone(monkeypatch, mode):
    """The same requests on Gemma and on a model of its three full layers alone: the same fetches, offloads and
    host bytes, byte for byte; Gemma's HBM is more by exactly the windows (one request)."""
    monkeypatch.setitem(specs.MODELS, "gemma-full-twin", full_twin())
    tr = uniform_trace(1, 3000, 40)
    hyb = run(tr, mode=mode).summary
    twin = run(tr, mode=mode, model="gemma-full-twin").summary
    assert hyb["h2d_bytes"] > 0
    for key in ("h2d_bytes", "d2h_bytes", "host_peak_bytes", "steps", "resident_recall"):
        assert hyb[key] == twin[key], key
    assert hyb["hbm_peak_bytes"] - twin["hbm_peak_bytes"] == WINDOWS


def test_windowed_layers_have_no_side_work_or_transfer(monkeypatch):
    works = []
    orig = LayerPipeline.step_closed

    def spy(self, t0, w, record=False):
        works.append(w)
        return orig(self, t0, w, record)

    monkeypatch.setattr(LayerPipeline, "step_closed", spy)
    cfg = SimConfig(**FAST, mode="lookahead")
    simulate(cfg, uniform_trace(1, 3000, 20))
    full = (5, 11, 17)
    # decode steps that selected and transferred (the prefill step's first fill transfers without selecting)
    decode = [w for w in works if w.background and max(w.xfer_s) > 0 and max(w.pred_s) > 0]
    assert len(decode) >= 10
    pred = RooflinePredictor(cfg.model_spec, cfg.hardware_spec)
    for w in decode:
        for l in range(18):
            if l in full:
                assert w.xfer_s[l] > 0 and w.pred_s[l] > 0 and w.select_s[l] > 0
            else:
                assert w.xfer_s[l] == 0 and w.pred_s[l] == 0 and w.select_s[l] == 0
        assert len({w.xfer_s[l] for l in full}) == 1  # the step's bytes split evenly over the full layers
    # a decode step of one request at ctx tokens: a windowed layer runs the GEMMs of 2 rows (token + draft) and
    # reads min(ctx, 512) tokens of one layer's KV; nothing else
    w = decode[-1]
    gemm = pred.time("gemm_layer", {"tokens": 2}) + pred.time("norm_rope", {"tokens": 2})
    assert w.compute_s[0] == gemm + pred.time("attn_decode", {"kv_bytes": 512 * TOKEN_LAYER})
    assert w.compute_s[5] > w.compute_s[0]  # the full layer adds its sparse attention, overheads, contention


def test_prefill_past_of_a_window():
    past = LayerKinds.prefill_past
    assert past(100, 0, 512) == 0.0  # inside the window: the full layer's
    assert past(100, 1000, 512) == 512 - 50  # beyond it: W keys a query
    assert past(200, 400, 512) == pytest.approx((112 * 400 + 112**2 / 2 + 88 * 512) / 200 - 100)
    kinds = LayerKinds(specs.get_model(G))
    assert kinds.distinct == (512,) and kinds.count == {512: 15} and kinds.n_full == 3
    assert kinds.window_tokens([100, 600, 512]) == {512: 100 + 512 + 512}


def test_a_model_whose_layers_are_all_full_runs_as_before(tmp_path, monkeypatch):
    before = run_outputs(tmp_path, "before")
    q = specs.get_model("qwen3-8b")
    monkeypatch.setitem(specs.MODELS, "qwen3-8b", replace(q, layer_windows=(None,) * q.n_layers))
    assert run_outputs(tmp_path, "explicit") == before


@pytest.mark.parametrize("model", ["gemma3-270m", "gemma3-27b", "gpt-oss-120b"])
@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_cli_runs_the_hybrid_presets_on_the_bundled_trace(tmp_path, model, mode):
    from oasis_sim.cli import main

    out = tmp_path / "o"
    assert main(["run", "--out", str(out), *QUICK, "--model", model, "--hardware", "h200", "--mode", mode]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["requests_completed"] == 3 and s["model"] == model
    assert s["full_layers"] == list(specs.get_model(model).full_layers)
    assert (s["h2d_bytes"] > 0) == (mode == "lookahead")


def test_split_hands_off_the_full_layers_and_the_windows():
    s = run(uniform_trace(1, 2000, 8), mode="lookahead", split="full").summary
    assert s["handoff_full_kv_bytes"] == 2000 * TOKEN_FULL + WINDOWS == s["handoff_kv_bytes"]
    s = run(uniform_trace(1, 2000, 8), mode="lookahead", split="rpf").summary
    assert WINDOWS < s["handoff_kv_bytes"] < 2000 * TOKEN_FULL + WINDOWS


def test_configs_a_hybrid_model_cannot_run(monkeypatch):
    every_window = replace(specs.get_model(G), name="all-windows", layer_windows=(512,) * 18)
    monkeypatch.setitem(specs.MODELS, "all-windows", every_window)
    with pytest.raises(ConfigError, match=r"mode: selects blocks of the full-attention layers"):
        SimConfig(model="all-windows", mode="lookahead")
    assert SimConfig(model="all-windows", mode="dense").model_spec.n_full_layers == 0
    with pytest.raises(ConfigError, match=r"prefix_cache: is not modelled for a hybrid model"):
        SimConfig(model=G, prefix_cache=True)


def test_recordings_carry_the_layer_kinds():
    from oasis_core.recording import RecordingError, build_recording
    from oasis_sim.replay import replay, sim_config
    from tests.helpers.replay_fakes import base_config, fake_results

    kinds = [None if l in (5, 11, 17) else 512 for l in range(18)]
    rec = build_recording(
        base_config(model=G, context=4096, concurrency=2, top_k=16, layer_windows=kinds), fake_results()
    )
    cfg = sim_config(rec)
    assert cfg.model_spec.layer_windows == tuple(kinds)
    res = replay(rec)
    assert res.predicted["tpot_ms_p50"] > 0
    # the replay's stages count the full layers' selection and each kind's attention: 3 full layers and 15 windows
    attn = pred = 0.0
    for calls in res.op_steps:
        a = [t for op, _s, t in calls if op == "attn_decode"]
        assert len(a) == 2  # the full layers' sparse attention, then the 512-token windows
        attn += 3 * a[0] + 15 * a[1]
        pred += 3 * sum(t for op, _s, t in calls if op in ("score", "topk"))
    k = len(res.op_steps)
    assert res.stage_ms_per_step["attn"] == pytest.approx(1e3 * attn / k, rel=1e-12)
    assert res.stage_ms_per_step["pred"] == pytest.approx(1e3 * pred / k, rel=1e-12)
    # the replay refuses kinds that are not the preset's; a full model's recording may say so
    with pytest.raises(ConfigError, match=r"layer_windows: the recorded layer kinds differ from model gemma3-270m"):
        sim_config(build_recording(base_config(model=G, layer_windows=[None] * 18), fake_results()))
    assert sim_config(build_recording(base_config(layer_windows=[None] * 36), fake_results())).model == "qwen3-8b"
    with pytest.raises(RecordingError, match=r"config.layer_windows\[2\]: must be >= 1, got 0"):
        build_recording(base_config(model=G, layer_windows=[None, 512, 0]), fake_results())
    with pytest.raises(RecordingError, match=r"config.layer_windows: must be a non-empty list or null"):
        build_recording(base_config(model=G, layer_windows="full"), fake_results())


def test_short_context_crossing_offloads_the_full_layers():
    w = 17 * 16  # top_k 16 + the local block: 272 tokens run dense
    res = run(uniform_trace(1, w - 3, 30), mode="lookahead")
    assert res.summary["d2h_bytes"] == w * TOKEN_FULL  # the crossing copies the full layers' KV so far, once
    hbm = [b for _, b in res.memory["decode.hbm"]]
    assert hbm[0] == w * (TOKEN_FULL + 15 * TOKEN_LAYER)  # while dense: 17 blocks on every layer (all < W)
    assert hbm[1] == RESIDENT_16 + DRAFT + 18 * ROWS * SUMMARY + 15 * 288 * TOKEN_LAYER  # sparse, windows of 288


@pytest.mark.parametrize("mode", ["lookahead", "dense"])
def test_closed_form_and_events_agree_on_per_layer_steps(mode):
    tr = uniform_trace(3, 1500, 24, gap_s=0.001)
    closed = run(tr, mode=mode, event_mode="closed", fast_forward=0)  # the events mode steps one at a time
    events = run(tr, mode=mode, event_mode="events")
    assert closed.steps.dur == events.steps.dur and closed.summary["h2d_bytes"] == events.summary["h2d_bytes"]


def test_speculative_steps_on_a_hybrid_model():
    s = run(uniform_trace(2, 3000, 40), mode="lookahead", speculative_k=2, speculative_alpha=0.8).summary
    assert s["speculative_steps"] > 0 and s["accepted_tokens_per_step"] > 1 and s["requests_completed"] == 2
