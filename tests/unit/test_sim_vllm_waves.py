"""vLLM's decode attention as waves of CTAs over the SMs (``oasis_sim.calibrated.vllm_attn_waves``): the term by hand,
its place in the engine's steps and stretches, and the fit that finds it."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from oasis_core.geometry import KVGeometry
from oasis_core.specs import get_hardware, get_model
from oasis_sim.bench import BenchPoint, load_points, run_point
from oasis_sim.calibrate import fit, predict
from oasis_sim.calibrated import CalibratedPredictor, load_calibration, vllm_attn_waves

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SM_BPS = 40e9  # an SM's stream: 132 SMs = 5.3 TB/s, a full wave below the H200's 4.8 TB/s x 0.85 only when part-filled


def test_waves_by_hand():
    """Qwen3-8B (8 KV heads) on 132 SMs: 8 requests = 64 CTAs, split in two (one wave of 128); 10 = 80 CTAs, not
    split (80 > 66); 16 = 128, one wave; 21 = 168, two; 40 = 320, three; SmolLM2 (3 KV heads) x 16 = 48 CTAs, split in
    two; 1 request of 8 KV heads, in 16 parts."""
    assert vllm_attn_waves(8, 8, 132) == (1, 128)
    assert vllm_attn_waves(10, 8, 132) == (1, 80)
    assert vllm_attn_waves(16, 8, 132) == (1, 128)
    assert vllm_attn_waves(21, 8, 132) == (2, 168)
    assert vllm_attn_waves(40, 8, 132) == (3, 320)
    assert vllm_attn_waves(16, 3, 132) == (1, 96)
    assert vllm_attn_waves(1, 8, 132) == (1, 128)
    assert vllm_attn_waves(0, 8, 132) == (0, 0)


def _pred(sm_bps, engine="vllm", mode="dense", model="qwen3-8b"):
    params = replace(load_calibration().params, vllm_sm_bytes_per_s=sm_bps)
    return CalibratedPredictor(get_model(model), get_hardware("h200"), params, mode, engine), params


def test_attention_is_the_larger_of_the_stream_and_the_busiest_sm():
    pred, params = _pred(SM_BPS)
    hbm = get_hardware("h200").hbm_bytes_per_s
    bpt = KVGeometry(get_model("qwen3-8b"), 16).bytes_per_token_layer
    for n, ctx in ((16, 16384), (21, 16384), (10, 32768), (8, 32768), (40, 16384)):
        kv = n * ctx * bpt
        waves, ctas = vllm_attn_waves(n, 8, 132)
        want = max(kv / (hbm * params.attn_eff_vllm), waves * kv / ctas / SM_BPS)
        assert pred.time("attn_decode", {"kv_bytes": kv, "requests": n}) == pytest.approx(want, rel=1e-12)
        # linear in the bytes at a given batch (what the engine's stretches rely on)
        assert pred.time("attn_decode", {"kv_bytes": 3 * kv, "requests": n}) == pytest.approx(3 * want, rel=1e-12)
    # 21 requests run two waves: longer than 10 requests of twice the context, which read 5% less in one wave
    t21 = pred.time("attn_decode", {"kv_bytes": 21 * 16384 * bpt, "requests": 21})
    t10 = pred.time("attn_decode", {"kv_bytes": 10 * 32768 * bpt, "requests": 10})
    t16 = pred.time("attn_decode", {"kv_bytes": 16 * 16384 * bpt, "requests": 16})
    assert t21 > t16 * 21 / 16 * 1.05 and t10 > t16 * 20 / 16 * 1.05
    # no batch given, our own engine, or the term off: the stream alone
    kv = 21 * 16384 * bpt
    stream = kv / (hbm * params.attn_eff_vllm)
    assert pred.time("attn_decode", {"kv_bytes": kv}) == pytest.approx(stream, rel=1e-12)
    assert _pred(0.0)[0].time("attn_decode", {"kv_bytes": kv, "requests": 21}) == pytest.approx(stream, rel=1e-12)
    ours, p2 = _pred(SM_BPS, engine="oasis")
    assert ours.time("attn_decode", {"kv_bytes": kv, "requests": 21}) == pytest.approx(
        kv / (hbm * p2.attn_eff_dense), rel=1e-12
    )


@pytest.fixture(scope="module")
def waves_file(tmp_path_factory):
    cal = load_calibration()
    path = tmp_path_factory.mktemp("cal") / "waves.json"
    path.write_text(replace(cal, params=replace(cal.params, vllm_sm_bytes_per_s=SM_BPS)).to_json())
    return str(path)


def test_closed_form_and_simulated_bench_agree_where_the_waves_bind(waves_file):
    """calibrate's closed form (the harness's report from the steady step a batch) is the simulator's vLLM bench run,
    where the wave term sets the step (16K x 21: two waves; 32K x 10: one wave of unsplit CTAs) and where not."""
    params = replace(load_calibration().params, vllm_sm_bytes_per_s=SM_BPS)
    off = replace(params, vllm_sm_bytes_per_s=0.0)
    for ctx, n in ((16384, 21), (32768, 10), (16384, 16)):
        p = BenchPoint("qwen3-8b", "dense", ctx, n, kv_budget_gb=52.0, engine="vllm", decode_chain=1)
        r = run_point(p, predictor="calibrated", calibration=waves_file)
        got = predict([p], params)[0]
        assert got == pytest.approx(r.tpot_s, rel=0.01), p.name
        if n != 16:  # the waves bind: the step is longer than with the stream alone
            assert got > 1.03 * predict([p], off)[0], p.name


def test_fit_finds_an_sm_rate_it_generated():
    """The training set's vLLM Qwen3-8B points (16K x 8 ... 40, 32K x 8, 10, 20) priced with a known SM rate and
    refitted from the default start: the rate comes back within 2% and every TPOT within 0.5%."""
    pts, _ = load_points([os.path.join(ROOT, "traces", "bench_points", "train")])
    pts = [p for p in pts if p.engine == "vllm" and p.model == "qwen3-8b"]
    assert len({(p.context, p.lanes) for p in pts}) >= 6
    params = replace(load_calibration().params, vllm_sm_bytes_per_s=30e9)
    t = predict(pts, params)
    synthetic = [replace(q, tpot_ms=float(s * 1e3), tok_s=None) for q, s in zip(pts, t)]
    got, used, err = fit(synthetic, base=replace(params, vllm_sm_bytes_per_s=0.0))
    assert len(used) == len(synthetic)
    assert np.max(np.abs(err)) < 0.005
    assert got.vllm_sm_bytes_per_s == pytest.approx(30e9, rel=0.02)
