"""The calibrated predictor, the bench's view and the calibration step (oasis_sim.calibrated / bench / calibrate)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace

import numpy as np
import pytest

from oasis_core import lanes
from oasis_core.geometry import KVGeometry
from oasis_core.specs import get_model
from oasis_sim.bench import BenchPoint, bench_trace, load_points, run_point
from oasis_sim.calibrate import fit, point_key, predict
from oasis_sim.calibrated import SHIPPED, load_calibration
from oasis_sim.sim import bench_lanes, make_requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_closed_form_equals_the_simulated_bench_step():
    """calibrate's steady step (fed the simulator's own bytes) is the engine's step for the same point."""
    params = load_calibration().params
    for p in (
        BenchPoint("qwen3-8b", "lookahead", 16384, 8, kv_budget_gb=52.0),
        BenchPoint("qwen3-8b", "lookahead", 16384, 8, kv_budget_gb=52.0, hot_slots=128, decode_chain=1),
        BenchPoint("smollm2-135m", "dense", 7800, 15, kv_budget_gb=3.0),
        BenchPoint("qwen3-8b", "dense", 16384, 8, kv_budget_gb=52.0, engine="vllm", decode_chain=1),
        BenchPoint("smollm2-135m", "dense", 8096, 32, engine="vllm", weights="real", decode_chain=1, decode=64),
    ):
        r = run_point(p, warmup=2, steps=3, predictor="calibrated")
        got = predict([replace(p, hot_slots=None)], params, bytes_of=lambda _p, b=r.bytes_per_step: b)[0]
        assert got == pytest.approx(r.tpot_s, rel=0.01), p.name


def test_vllm_harness_clock_starts_at_the_last_first_token():
    """vllm_dense.py's TPOT (decode_s · lanes / decode_tokens after the last request's first token), by hand: a 16,384-
    token budget a step, decodes first, prompts in order. 3 x 10,000: step 1 finishes request 0 and 6,384 tokens of
    request 1; step 2 (16,383 left after one decode) finishes 1 and 2: tokens at the clock's start 2, 1, 1. 2 x 16,384:
    request 1's last token waits a step behind request 0's decode: 3, 1. With decode 4 these requests run 2 and 4 more
    steps: a constant 1 s step reports 4 s · 2 lanes / 6 tokens; a step linear in the batch reports its full-batch
    step (the early finishers' steps are cheaper in proportion)."""
    from oasis_sim.bench import vllm_first_tokens, vllm_harness_tpot

    assert vllm_first_tokens(3, 10000) == [2, 1, 1]
    assert vllm_first_tokens(2, 16384) == [3, 1]
    assert vllm_first_tokens(4, 100) == [1, 1, 1, 1]
    assert vllm_harness_tpot(lambda b: 1.0, 2, 16384, 4) == pytest.approx(4 * 2 / 6)
    assert vllm_harness_tpot(lambda b: 0.5 * b, 2, 16384, 4) == pytest.approx(1.0)
    # the simulator's own vLLM run reports the same: its closed loop from the clock's start, the early ones ending first
    p = BenchPoint("smollm2-135m", "dense", 8096, 32, engine="vllm", weights="real", decode_chain=1, decode=64)
    from oasis_core.specs import get_hardware
    from oasis_sim.calibrate import steady_step_s
    from oasis_sim.calibrated import CalibratedPredictor

    params = load_calibration().params
    pred = CalibratedPredictor(get_model(p.model), get_hardware(p.hardware), params, p.mode, p.engine)
    steady = steady_step_s(pred, p, 0.0, params)
    r = run_point(p, predictor="calibrated")
    assert r.lanes == 32 and r.tpot_s > 1.03 * steady  # H200: 3.54 ms reported over 3.09 ms a step


def test_victim_cache_and_lanes_follow_the_executor_rule():
    """At 52 GB and 16K, 48 lanes hold a victim cache of 3K slots a row, 96 do not (figures_victim_vllm_4e13b06,
    fp8_both_vllm_6fa88eb); the simulator and oasis_core.lanes agree."""
    for n, slots in ((48, 384), (96, 128)):
        p = BenchPoint("qwen3-8b", "lookahead", 16384, n, kv_budget_gb=52.0)
        cfg = p.config()
        reqs = make_requests(bench_trace(16384, n, 40), cfg)
        got = bench_lanes(cfg, KVGeometry(get_model("qwen3-8b"), 16), reqs)
        assert got.slots == slots
        assert got.lanes == int(52e9 // got.lane_bytes) >= n
    geo = KVGeometry(get_model("qwen3-8b"), 16)
    assert lanes.sparse_lane_bytes(geo, 384, 1030) > lanes.sparse_lane_bytes(geo, 128, 1030)
    assert lanes.budget_lanes(None, 10, None) == lanes.DEFAULT_LANES
    assert lanes.budget_lanes(100.0, 10, 3) == 3
    assert lanes.host_pool_blocks(None, 10, 4, 100, 7) == 400


def test_no_transfer_twin_and_decode_chain():
    p = BenchPoint("qwen3-8b", "lookahead", 16384, 8, kv_budget_gb=52.0, hot_slots=128)
    with_copy = run_point(p, warmup=2, steps=3, predictor="calibrated")
    twin = run_point(replace(p, no_transfer=True), warmup=2, steps=3, predictor="calibrated")
    assert with_copy.bytes_per_step > 0 and twin.bytes_per_step == 0
    assert twin.tpot_s < with_copy.tpot_s
    chain1 = run_point(replace(p, decode_chain=1), warmup=2, steps=3, predictor="calibrated")
    host = load_calibration().params.step_host_s
    assert chain1.tpot_s - with_copy.tpot_s == pytest.approx(host * (1 - 1 / 8), rel=0.02)


def test_fit_recovers_constants_it_generated():
    """Points whose TPOT the shipped constants predict are refitted to within 1% of every TPOT."""
    pts, _ = load_points([os.path.join(ROOT, "traces", "bench_points", "train")])
    pts = [p for p in pts if p.decode_chain == 8 or p.model == "smollm2-135m" or p.engine == "vllm"][:30]
    params = load_calibration().params
    t = predict(pts, params)
    synthetic = [replace(q, tpot_ms=float(s * 1e3), tok_s=None) for q, s in zip(pts, t)]
    got, used, err = fit(synthetic)
    assert len(used) == len(synthetic)
    assert np.max(np.abs(err)) < 0.01


def test_vllm_floor_grows_with_the_batch_only_where_probes_show_it():
    """vLLM's least step is ``step_vllm_s + n · step_vllm_request_s``: refitted from floor probes that a known
    growth generated (small-model runs at 1-64 requests, where the host loop binds) it comes back within 5%; with one
    batch size it is not fitted (it stays 0)."""
    from oasis_sim.calibrate import floor_probes

    params = replace(load_calibration().params, step_vllm_s=2.5e-3, step_vllm_request_s=40e-6)
    pts, _ = load_points([os.path.join(ROOT, "traces", "bench_points", "train")])
    probes = [
        BenchPoint("smollm2-135m", "dense", 2048, n, engine="vllm", weights="real", decode_chain=1, bytes_per_step=0.0)
        for n in (1, 4, 16, 32, 64)
    ]
    pts = [p for p in pts if p.decode_chain == 8 or p.model == "smollm2-135m" or p.engine == "vllm"][:30] + probes
    t = predict(pts, params)
    assert t[-1] > t[-5] + 60 * 40e-6 * 0.9  # the probes are floor-bound: their steps carry the growth
    synthetic = [replace(q, tpot_ms=float(s * 1e3), tok_s=None) for q, s in zip(pts, t)]
    assert floor_probes(synthetic) and not floor_probes(synthetic[:-5])
    got, _, err = fit(synthetic)
    assert got.step_vllm_request_s == pytest.approx(40e-6, rel=0.05)
    assert np.max(np.abs(err)) < 0.01
    assert fit(synthetic[:-5])[0].step_vllm_request_s == 0.0


def test_another_cards_points_enter_only_as_host_floor_probes():
    """A calibration of the H200 takes an H100 point only as a vLLM floor probe at <= FLOOR_KNEE_REQUESTS requests,
    scored against the floor a + b · n alone (no GPU constant fitted on the H100); the H100's steps past the knee and
    its OasisKV points are left out and named (calibrate's ``fit.other_card_left_out``)."""
    from oasis_sim.calibrate import FLOOR_KNEE_REQUESTS, calibrate, card_admits

    h100 = dict(engine="vllm", weights="real", decode_chain=1, bytes_per_step=0.0, hardware="h100-sxm")
    assert card_admits(BenchPoint("smollm2-135m", "dense", 2048, 64, engine="vllm"), "h200")
    assert card_admits(BenchPoint("smollm2-135m", "dense", 2048, FLOOR_KNEE_REQUESTS, **h100), "h200")
    assert not card_admits(BenchPoint("smollm2-135m", "dense", 2048, FLOOR_KNEE_REQUESTS + 1, **h100), "h200")
    assert not card_admits(BenchPoint("qwen3-8b", "lookahead", 16384, 4, hardware="h100-sxm"), "h200")
    assert card_admits(BenchPoint("qwen3-8b", "lookahead", 16384, 4, hardware="h100-sxm"), "h100-sxm")

    params = replace(load_calibration().params, step_vllm_s=1.0e-3, step_vllm_request_s=20e-6)
    pts, _ = load_points([os.path.join(ROOT, "traces", "bench_points", "train")])
    pts = [p for p in pts if p.hardware == "h200"]
    pts = [p for p in pts if p.decode_chain == 8 or p.model == "smollm2-135m" or p.engine == "vllm"][:30]
    synthetic = [replace(q, tpot_ms=float(s * 1e3), tok_s=None) for q, s in zip(pts, predict(pts, params))]
    # the H100's probes at the floor a + b · n, below and past the knee, the past ones 3x off (attention-bound); the
    # floor sits below the GPU step these constants give on the H100 (~1.5 ms): priced whole, the probes would not fit
    probes = [
        BenchPoint("smollm2-135m", "dense", ctx, n, tpot_ms=(1.0 + n * 0.02) * (1 if n <= 8 else 3), **h100)
        for ctx in (2048, 7800)
        for n in (1, 2, 4, 8, 16, 64)
    ]
    wrong = BenchPoint("qwen3-8b", "lookahead", 16384, 8, tpot_ms=50.0, bytes_per_step=0.0, hardware="h100-sxm")
    got, used, err = fit(synthetic + probes + [wrong], card="h200")
    assert len(used) == len(synthetic) + 8 and {p.lanes for p in used if p.hardware != "h200"} == {1, 2, 4, 8}
    assert np.max(np.abs(err)) < 0.01
    assert predict(probes[:1], params)[0] > 1.3e-3  # the GPU step on the H100 at one request, above the floor
    assert got.step_vllm_s == pytest.approx(1.0e-3, rel=0.02)
    assert got.step_vllm_request_s == pytest.approx(20e-6, rel=0.05)
    cal = calibrate(synthetic + probes + [wrong], [], card="h200")
    assert cal.hardware == "h200" and len(cal.fit["other_card_fitted"]) == 8
    assert len(cal.fit["other_card_left_out"]) == 5 and any("qwen3-8b" in n for n in cal.fit["other_card_left_out"])


def test_the_probe_cards_host_ratio_is_fitted_where_the_cards_own_steps_show_its_floor():
    """Probes on an H100 host that runs vLLM's loop 1.4x faster than the calibrated card's: with H200 vLLM points that
    sit on the floor (SmolLM2 at 2,048 tokens x 16 and 32: the GPU step 1.7-1.9 ms under a 2.5-3 ms floor), the fit
    finds the ratio and the H200's own floor; the simulator on the H100 then prices the probe card's floor, on the
    H200 the fitted one, on a card without probes the fitted one. (Without such points the ratio stays 1: the test
    above.)"""
    from oasis_sim.calibrate import calibrate
    from oasis_sim.calibrated import Calibration

    true = replace(load_calibration().params, step_vllm_s=2.0e-3, step_vllm_request_s=30e-6, vllm_host_ratio=1.4)
    pts, _ = load_points([os.path.join(ROOT, "traces", "bench_points", "train")])
    pts = [p for p in pts if p.hardware == "h200" and p.measured_tpot_s()]
    own = [
        BenchPoint("smollm2-135m", "dense", 2048, n, engine="vllm", weights="real", decode_chain=1, decode=256)
        for n in (16, 32)
    ]
    assert predict(own, replace(true, step_vllm_s=0.0, step_vllm_request_s=0.0)).max() < 2.0e-3  # GPU step alone
    synthetic = [replace(q, tpot_ms=float(s * 1e3), tok_s=None) for q, s in zip(pts + own, predict(pts + own, true))]
    from oasis_sim.calibrate import harness_tpot

    h100 = dict(engine="vllm", weights="real", decode_chain=1, bytes_per_step=0.0, hardware="h100-sxm", decode=256)
    probes = []
    for ctx in (2048, 7800):
        for n in (1, 2, 4, 8):
            q = BenchPoint("smollm2-135m", "dense", ctx, n, **h100)
            t = harness_tpot(q, lambda k: (2.0e-3 + k * 30e-6) / 1.4)
            probes.append(replace(q, tpot_ms=t * 1e3))
    got, used, err = fit(synthetic + probes, card="h200")
    assert np.max(np.abs(err)) < 0.01
    assert got.vllm_host_ratio == pytest.approx(1.4, rel=0.03)
    assert got.step_vllm_s == pytest.approx(2.0e-3, rel=0.03)
    cal = calibrate(synthetic + probes, [], card="h200")
    assert cal.fit["probe_cards"] == ["h100-sxm"]
    a = cal.params.step_vllm_s
    assert cal.params_on("h200").step_vllm_s == a
    assert cal.params_on("h100-sxm").step_vllm_s == pytest.approx(a / cal.params.vllm_host_ratio)
    assert cal.params_on("h100-pcie").step_vllm_s == a  # no probes of that card: the calibrated card's host
    assert Calibration(cal.params, "h200").params_on("h100-sxm").step_vllm_s == a  # a file without probe cards


def test_shipped_calibration_names_its_provenance():
    cal = load_calibration(SHIPPED)
    assert cal.hardware == "h200" and cal.date and cal.commit
    assert cal.fit["points"] >= 40 and cal.fit["fitted_points"]
    for entry in cal.fitted_on:
        path, sha = entry.split(" sha256:")
        with open(os.path.join(ROOT, path), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest()[:16] == sha, path
    models = {p.model for p in load_points([os.path.join(ROOT, path.split(" ")[0]) for path in cal.fitted_on])[0]}
    assert {"qwen3-8b", "smollm2-135m"} <= models


def test_heldout_points_were_never_fitted():
    cal = load_calibration()
    held, _ = load_points([os.path.join(ROOT, "traces", "bench_points", "heldout")])
    assert held and not {point_key(p) for p in held} & set(cal.fit["fitted_points"])


def test_validate_refuses_a_fitted_point():
    from oasis_sim.validate_bench import LeakError, validate_points

    pts, _ = load_points([os.path.join(ROOT, "traces", "bench_points", "train", "vllm_dense.jsonl")])
    with pytest.raises(LeakError):
        validate_points(pts[:1], ("calibrated",))


def test_run_defaults_to_the_calibrated_predictor():
    from oasis_sim.cli import build_parser, config_from_args

    args = build_parser().parse_args(["run", "--max-requests", "2"])
    assert config_from_args(args).predictor == "calibrated"
    args = build_parser().parse_args(["run", "--predictor", "roofline"])
    assert config_from_args(args).predictor == "roofline"


def test_calibrated_ops_never_beat_the_physical_floor():
    from oasis_core.specs import get_hardware
    from oasis_sim.calibrated import CalibratedPredictor
    from oasis_sim.predictor import RooflinePredictor

    params = load_calibration().params
    for model in ("qwen3-8b", "smollm2-135m"):
        m, hw = get_model(model), get_hardware("h200")
        floor = RooflinePredictor.floor(m, hw)
        for mode, engine in (("lookahead", "oasis"), ("dense", "oasis"), ("dense", "vllm")):
            p = CalibratedPredictor(m, hw, params, mode, engine)
            for op, shape in (
                ("gemm_layer", {"tokens": 1}),
                ("gemm_layer", {"tokens": 8192}),
                ("attn_decode", {"kv_bytes": 1e9}),
                ("attn_decode", {"kv_bytes": 1e9, "kind": "sliding"}),
                ("lm_head", {"tokens": 64}),
                ("step_overhead", {"chain": 8}),
            ):
                assert p.time(op, shape) >= floor.time(op, shape), (model, mode, engine, op)


def test_bench_command_prints_the_executor_bench_figures(capsys):
    import json

    from oasis_sim.cli import main

    argv = ["bench", "--context", "4096", "--concurrency", "8", "--model", "smollm2-135m", "--hardware", "h200"]
    assert main([*argv, "--top-k", "64", "--kv-budget-gb", "3", "--steps", "2", "--warmup", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["point"] == "oasis:smollm2-135m:lookahead:4096x8:K64" and out["predictor"] == "calibrated"
    assert out["lanes"] == 8 and out["tok_s"] == pytest.approx(8 / (out["tpot_ms"] / 1e3), rel=1e-3)
    assert main([*argv, "--mode", "quest", "--engine", "vllm"]) == 2  # vLLM runs dense only: one line, exit 2


def test_fast_forward_changes_no_bench_figure():
    """The fast-forward takes most of a bench's steps at once; the figures are those of every step simulated."""
    for p in (
        BenchPoint("qwen3-8b", "dense", 16384, 8, kv_budget_gb=52.0),
        BenchPoint("smollm2-135m", "dense", 7800, 16, kv_budget_gb=3.0, engine="vllm", decode_chain=1),
        BenchPoint("smollm2-135m", "lookahead", 4096, 8, top_k=64, kv_budget_gb=3.0),
    ):
        fast, slow = run_point(p, warmup=9, steps=4), run_point(p, warmup=9, steps=4, fast_forward=0)
        # dense: exact; sparse: a stretch leaves out the summaries of the blocks it crosses (1e-5 measured)
        rel = 1e-9 if p.mode == "dense" else 1e-4
        assert fast.tpot_s == pytest.approx(slow.tpot_s, rel=rel), p.name
        assert fast.bytes_per_step == pytest.approx(slow.bytes_per_step, rel=1e-9), p.name


def test_timing_line_says_when_the_run_is_on_another_card_than_the_calibration():
    from oasis_sim.cli import build_parser, config_from_args, timing_line

    args = build_parser().parse_args(["run", "--hardware", "h200"])
    assert timing_line(config_from_args(args)).endswith("at " + load_calibration().commit)
    args = build_parser().parse_args(["run", "--hardware", "h100-sxm"])
    assert "h100-sxm" in load_calibration().fit["probe_cards"]  # the shipped file: vLLM's floor probes on an H100
    assert timing_line(config_from_args(args)).endswith(
        "on h100-sxm: its peaks and vLLM floor probes, h200's other host and copy costs"
    )
    args = build_parser().parse_args(["run", "--predictor", "roofline"])
    assert timing_line(config_from_args(args)) == "roofline predictor"


def test_bench_point_carries_the_executor_block_scorer():
    """A point names the executor's block scorer (its record's block_score, token_rank) and the simulator prices that
    scorer; a point without them keeps the content key it had before the fields existed (the shipped fit's keys)."""
    import dataclasses

    p = BenchPoint(model="gemma3-270m", mode="lookahead", context=4096, lanes=4, tpot_ms=1.0)
    q = replace(p, block_score="tokens", token_rank=64)
    cp, cq = p.config(), q.config()
    assert (cq.block_score, cq.token_rank) == ("tokens", 64) and cp.block_score != "tokens"
    d = dataclasses.asdict(p)
    for k in ("source", "note", "warmup", "steps", "decode", "block_score", "token_rank"):
        d.pop(k)
    assert point_key(p) == hashlib.sha1(repr(sorted(d.items())).encode()).hexdigest()[:16]
    assert point_key(q) != point_key(p)
