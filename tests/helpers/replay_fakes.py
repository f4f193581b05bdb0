"""Synthetic recordings for the replay/validate tests: a 'hardware' that is the simulator itself with hidden
efficiency factors and copy rate, so a fitted predictor has something known to recover. Never committed as data."""

from __future__ import annotations

from oasis_core.recording import Recording, build_recording, closed_loop_requests
from oasis_core.trace import Trace
from oasis_sim.predictor import RooflineParams, RooflinePredictor
from oasis_sim.replay import replay, sim_config

# The hidden truth: slower GEMMs and attention than the roofline assumes, a larger step overhead, slower copies.
TRUTH = RooflineParams(
    gemm_mem_eff=0.42,
    attn_mem_eff=0.8,
    score_mem_eff=0.5,
    step_overhead_s=900e-6,
    select_fixed_s=35e-6,
    layer_overhead_s=9e-6,
)
TRUTH_H2D = 24e9


class _TruthPredictor(RooflinePredictor):
    h2d_bytes_per_s = TRUTH_H2D

    def __init__(self, model, hw):
        super().__init__(model, hw, TRUTH)
        self.attn_Bps = hw.hbm_bytes_per_s * TRUTH.attn_mem_eff  # ignore the measured H200 figure


def base_config(mode="lookahead", context=8192, concurrency=8, fetch_ratio=0.05, steps=12, warmup=2, **kw):
    c = {
        "mode": mode,
        "model": "qwen3-8b",
        "hardware": "h200",
        "workload": "closed-loop",
        "context": context,
        "concurrency": concurrency,
        "kv_budget_gb": 100.0,
        "top_k": 128,
        "block_size": 16,
        "fetch_ratio": fetch_ratio,
        "transfer_path": None if mode == "dense" else "dma",
        "selection": "synthetic",
        "seed": 0,
        "warmup_steps": warmup,
        "steps": steps,
    }
    c.update(kw)
    return c


def fake_results(**over):
    r = {
        "tpot_ms_p50": 20.0,
        "tpot_ms_p99": 22.0,
        "throughput_tok_s": 400.0,
        "ttft_ms_p50": None,
        "stage_ms_per_step": {"layers": 15.0, "pred": 2.0, "select": 0.5, "transfer": 4.0, "stall": 0.2},
        "bytes_per_step": {"pcie_h2d": 1.0e8},
        "stall_ms_per_step": 0.2,
        "hidden_fraction": 0.95,
        "device": "NVIDIA H200",
        "date": "2026-12-01T00:00:00+00:00",
        "commit": "0000000",
    }
    r.update(over)
    return r


def synthetic_recording(truth_share=None, truth_h2d=None, with_stages=True, **cfg_kw) -> Recording:
    """A recording whose 'measurements' come from the simulator run with the hidden truth predictor.
    ``truth_share`` / ``truth_h2d``: hidden UVA gather SM share and copy rate (default: the configuration's share,
    ``TRUTH_H2D``); ``with_stages=False``: no per-stage times, as a CUDA-graph recording (TPOT and bytes only)."""
    c = base_config(**cfg_kw)
    shell = build_recording(c, fake_results())
    cfg = sim_config(shell)
    truth = _TruthPredictor(cfg.model_spec, cfg.hardware_spec)
    if truth_share is not None:
        truth.gather_sm_share = truth_share
    if truth_h2d is not None:
        truth.h2d_bytes_per_s = truth_h2d
    res = replay(shell, truth)
    p, st = res.predicted, res.stage_ms_per_step
    stages = {"layers": st["layers"], "pred": st["pred"], "select": st["select"], "stall": st["stall"]}
    if c["mode"] != "dense":
        stages["transfer"] = st["transfer"]
    else:
        stages = {"layers": st["layers"]}
    stall = p["stall_ms_per_step"]
    if not with_stages:
        stages, stall = {}, None
    durs = [res.sim.steps.dur[i] for i in res.window]
    results = fake_results(
        tpot_ms_p50=p["tpot_ms_p50"],
        tpot_ms_p99=p["tpot_ms_p99"],
        throughput_tok_s=p["throughput_tok_s"],
        tpot_ms_mean=1e3 * sum(durs) / len(durs),
        stage_ms_per_step=stages,
        bytes_per_step={"pcie_h2d": p["pcie_h2d_bytes_per_step"]},
        stall_ms_per_step=stall,
        hidden_fraction=None,
        steps=[{"step": j, "duration_s": d} for j, d in enumerate(durs)],
    )
    return build_recording(c, results, meta={"synthetic": "tests/helpers/replay_fakes.py"})


def tiny_trace(n=2):
    return Trace(closed_loop_requests(n, 64, 4))
