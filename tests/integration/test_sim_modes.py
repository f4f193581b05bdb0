"""Whole simulations on tiny traces: every mode, admission, preemption, split, determinism, fast path."""

import pytest

from oasis_sim.config import MODES, SimConfig
from oasis_sim.sim import simulate
from oasis_sim.workloads import uniform_trace

FAST = dict(top_k=16, policy_layers=1, profile_steps=8, timeline_steps=5)


def run(trace, **kw):
    return simulate(SimConfig(**{**FAST, **kw}), trace)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_completes_a_tiny_trace(mode):
    tr = uniform_trace(4, 1500, 12, gap_s=0.01)
    res = run(tr, mode=mode)
    s = res.summary
    assert s["requests_completed"] == 4 and s["output_tokens"] == 48
    assert s["throughput_tok_s"] > 0 and s["tpot_ms_p50"] > 0 and s["ttft_ms_p50"] > 0
    if mode in ("dense", "quest"):
        assert s["h2d_bytes"] == 0 and s["resident_recall"] == 1.0 and s["host_peak_bytes"] == 0
    else:
        assert s["h2d_bytes"] > 0 and s["host_peak_bytes"] > 0
    if mode != "lookahead" and mode != "proxy":
        assert s["stall_ms_total"] == 0  # nothing runs in the background
    assert len(res.requests) == 4
    assert '"traceEvents"' in res.files()["timeline.json"]


def test_admission_blocked_by_host_dram():
    # Host DRAM holds one 1,600-token request (100 blocks x 16 x 144 KiB = 236 MB) but not two.
    tr = uniform_trace(2, 1600, 8)
    one = 100 * 16 * 147456
    res = run(tr, mode="lookahead", host_bytes=one * 1.5)
    a, b = res.requests
    assert a["admit_s"] == 0.0
    assert b["admit_s"] == a["finish_s"]  # admitted the instant the first one released its host memory
    free = run(tr, mode="lookahead", host_bytes=one * 3).requests
    assert free[1]["admit_s"] == 0.0


def test_preemption_by_recomputation_is_counted():
    # HBM for KV just above two prompts: decode growth must preempt the later request, which still finishes.
    tr = uniform_trace(2, 1600, 400)
    spec_weights = SimConfig().model_spec.weight_bytes
    kv = 2 * 101 * 16 * 147456
    res = run(tr, mode="dense", hbm_bytes=(spec_weights + kv) / 0.9 + 1)
    assert res.summary["preemptions"] >= 1
    assert res.summary["requests_completed"] == 2
    assert max(r["preemptions"] for r in res.requests) >= 1


def test_closed_loop_keeps_concurrency():
    tr = uniform_trace(6, 800, 5)
    res = run(tr, mode="dense", concurrency=2)
    admits = sorted(r["admit_s"] for r in res.requests)
    assert admits[:2] == [0.0, 0.0] and admits[2] > 0


def test_poisson_arrivals_are_seeded():
    tr = uniform_trace(5, 800, 5)
    a = run(tr, mode="dense", arrival="poisson", rate_rps=10.0, seed=3).requests
    b = run(tr, mode="dense", arrival="poisson", rate_rps=10.0, seed=3).requests
    c = run(tr, mode="dense", arrival="poisson", rate_rps=10.0, seed=4).requests
    assert [r["arrival_s"] for r in a] == [r["arrival_s"] for r in b] != [r["arrival_s"] for r in c]


def test_event_mode_gives_identical_results():
    tr = uniform_trace(5, 3000, 20, gap_s=0.002)
    for mode in ("lookahead", "retrieval", "dense"):
        # the fast-forward (closed form only) repeats a steady step's duration: off, the two forms are one model
        a = run(tr, mode=mode, event_mode="closed", timeline_steps=0, fast_forward=0).files()
        b = run(tr, mode=mode, event_mode="events", timeline_steps=0).files()
        assert a == b, mode


def test_determinism_same_seed_same_bytes():
    tr = uniform_trace(6, 2500, 15, gap_s=0.003)
    a = run(tr, seed=7, policy_sampling="exact").files()
    b = run(tr, seed=7, policy_sampling="exact").files()
    assert a == b
    c = run(tr, seed=8, policy_sampling="exact").files()
    assert c["summary.json"] != a["summary.json"]


def test_split_full_vs_rpf_and_prefix_cache():
    ids = lambda i: [0, 1, 2, 3, 100 + i, 200 + i, 300 + i, 400 + i]  # noqa: E731 - a shared 2K-token prefix
    tr = uniform_trace(4, 4096, 10, gap_s=0.05, prefix_ids=ids)
    full = run(tr, split="full").summary
    rpf = run(tr, split="rpf").summary
    assert full["requests_completed"] == rpf["requests_completed"] == 4
    assert rpf["handoff_bytes"] < full["handoff_bytes"] == full["handoff_full_kv_bytes"]
    assert full["net_bytes"] == pytest.approx(full["handoff_bytes"], rel=1e-9)
    cached = run(tr, split="full", prefix_cache=True).summary
    assert cached["prefix_hit_tokens"] == 3 * 2048
    assert cached["net_bytes"] < full["net_bytes"]
    assert cached["ttft_ms_p50"] <= full["ttft_ms_p50"]


def test_colocated_prefix_cache_skips_prefill():
    ids = lambda i: [7, 8, 9 + i]  # noqa: E731
    tr = uniform_trace(3, 1500, 4, gap_s=1.0, prefix_ids=ids)
    hit = run(tr, mode="dense", prefix_cache=True).requests
    miss = run(tr, mode="dense").requests
    assert [r["prefix_hit_tokens"] for r in hit] == [0, 1024, 1024]
    assert hit[1]["ttft_ms"] < miss[1]["ttft_ms"]
