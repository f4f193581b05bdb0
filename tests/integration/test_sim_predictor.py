"""Roofline figures against hand calculation."""

import pytest

from oasis_core.specs import get_hardware, get_model
from oasis_sim.predictor import RooflineParams, RooflinePredictor


@pytest.fixture
def pred():
    return RooflinePredictor(get_model("qwen3-8b"), get_hardware("h100-sxm"))


def test_gemm_memory_bound_at_small_batch(pred):
    # Qwen3-8B layer: QKV 4096x(4096+2*1024) + O 4096x4096 + MLP 3x4096x12288 + QK-norm 2x128 = 192,938,240 params.
    params = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 12288 + 256
    assert pred.layer_params == params
    want = params * 2 / (3.35e12 * 0.55) + 4e-6
    assert pred.time("gemm_layer", {"tokens": 32}) == pytest.approx(want, rel=1e-12)


def test_gemm_compute_bound_at_large_batch(pred):
    params = pred.layer_params
    want = 2 * 8192 * params / (989e12 * 0.6) + 4e-6
    assert pred.time("gemm_layer", {"tokens": 8192}) == pytest.approx(want, rel=1e-12)


def test_attention_by_kv_bytes(pred):
    # 32 requests x 16K tokens x 4 KiB per token per layer (2 x 8 heads x 128 x 2 B) at 0.9 x 3.35 TB/s.
    kv = 32 * 16384 * 4096
    assert pred.time("attn_decode", {"kv_bytes": kv}) == pytest.approx(kv / (3.35e12 * 0.9), rel=1e-12)


def test_prefill_attention_flops(pred):
    # 4 x 32 heads x 128 x 1024 tokens x (2048 past + 512) FLOPs at 0.5 x 989 TFLOP/s.
    fl = 4 * 32 * 128 * 1024 * (2048 + 512)
    t = pred.time("attn_prefill", {"tokens": 1024, "past_tokens": 2048})
    assert t == pytest.approx(fl / (989e12 * 0.5), rel=1e-12)


def test_measured_attention_rate_is_used_when_known():
    p = RooflinePredictor(get_model("qwen3-8b"), get_hardware("h200"))
    assert p.time("attn_decode", {"kv_bytes": 4.3e12}) == pytest.approx(1.0)


def test_other_ops_and_overheads(pred):
    assert pred.time("step_overhead", {}) == 300e-6
    assert pred.time("select", {"rows": 1000}) == pytest.approx(20e-6 + 2e-6)
    assert pred.time("score", {"summary_bytes": 2.345e9}) == pytest.approx(2.345e9 / (3.35e12 * 0.7))
    lm = 4096 * 151936 * 2 / (3.35e12 * 0.55) + 151936 * 4 / (3.35e12 * 0.7) + 50e-6
    assert pred.time("lm_head", {"tokens": 1}) == pytest.approx(lm, rel=1e-12)


def test_efficiencies_are_parameters_and_validated():
    fast = RooflinePredictor(get_model("qwen3-8b"), get_hardware("h100-sxm"), RooflineParams(gemm_mem_eff=1.0))
    assert fast.time("gemm_layer", {"tokens": 1}) < RooflinePredictor(
        get_model("qwen3-8b"), get_hardware("h100-sxm")
    ).time("gemm_layer", {"tokens": 1})
    with pytest.raises(ValueError, match="RooflineParams.gemm_mem_eff: must be in"):
        RooflineParams(gemm_mem_eff=1.5)
    with pytest.raises(ValueError, match="unknown 'nope'"):
        fast.time("nope", {})


def test_sparse_overhead_and_side_contention_terms():
    from oasis_sim.config import SimConfig
    from oasis_sim.sim import simulate
    from oasis_sim.workloads import uniform_trace

    m, hw = get_model("qwen3-8b"), get_hardware("h100-sxm")
    p = RooflinePredictor(m, hw)
    assert p.time("sparse_overhead", {"requests": 10}) == pytest.approx(10 * 6.7e-6)
    assert p.time("side_contention", {"hbm_bytes": 1e6}) == pytest.approx(1e6 / p.attn_Bps)
    off = RooflinePredictor(m, hw, RooflineParams(sparse_request_layer_s=0.0, side_hbm_contention=0.0))
    assert off.time("sparse_overhead", {"requests": 10}) == 0.0 == off.time("side_contention", {"hbm_bytes": 1e6})
    # In a lookahead step both lengthen the compute stream: 36 layers x 8 requests x 6.7 us and more.
    tr = uniform_trace(8, 4000, 20, gap_s=0.0)
    cfg = SimConfig(mode="lookahead", top_k=32, policy_layers=1, profile_steps=8, timeline_steps=0, concurrency=8)
    with_terms = simulate(cfg, tr, p).summary["tpot_ms_p50"]
    without = simulate(cfg, tr, off).summary["tpot_ms_p50"]
    assert with_terms - without > 36 * 8 * 6.7e-3
