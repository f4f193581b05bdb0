"""The hisparse baseline through the executor on the CPU (tiny random model, float32) and the simulator: against
retrieval on the same run (the same top-K every step, the same tokens, fewer blocks fetched), the slots holding
their blocks' host copies across short-context crossings, the CUDA path's one-launch fetch (interpreted) equal to
the torch path, and the simulator's hot cache. (hisparse == dense when top-K covers every block:
test_exec_engine.test_sparse_equals_dense_when_top_k_covers_every_block.)"""

import dataclasses

import pytest
import torch
from exec_cases import cfg, drive, live_lanes, prompts, run_logits
from test_exec_engine import _check_mapping

from oasis_exec.engine.engine import Engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _keep(runners, preds):
    """A runner hook keeping the runner and every prediction (layer, [B * H, K]) of its run."""

    def hook(r):
        runners.append(r)
        predict = r.model.selector.predict

        def kept(l, *a, **kw):
            p = predict(l, *a, **kw)
            preds.append((l, p.clone()))
            return p

        r.model.selector.predict = kept

    return hook


@pytest.mark.parametrize("short_context", [True, False])
def test_hisparse_attends_retrievals_top_k_and_fetches_less(short_context):
    ps = prompts(2, (40, 150, 75))  # 40 and 75 cross the 64-token short window mid-run when it is on
    runs = {}
    for mode, kw in (("retrieval", {}), ("hisparse", {"hot_slots": 8})):
        runners, preds = [], []
        logs, out = run_logits(cfg(mode, top_k=3, short_context=short_context, **kw), ps, 60, _keep(runners, preds))
        runs[mode] = (logs, out, runners[0].counters(), preds)
    (ref, out_ref, c_ref, p_ref), (got, out, c_got, p_got) = runs["retrieval"], runs["hisparse"]
    assert len(p_ref) == len(p_got) > 100
    for (la, a), (lb, b) in zip(p_ref, p_got):  # the same selection every step and layer
        assert la == lb and torch.equal(a, b)
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.allclose(a, b, atol=2e-4, rtol=2e-4), (a - b).abs().max()
    assert c_got["units_fetched"] == c_got["missing"] > 0  # uncapped: every miss of the hot cache is fetched
    assert c_got["units_fetched"] < 0.7 * c_ref["units_fetched"]


def test_hot_slots_equal_to_top_k_is_retrieval():
    ps = prompts(3, (90, 130))
    a = run_logits(cfg("retrieval", top_k=3), ps, 30, _keep(ra := [], []))
    b = run_logits(cfg("hisparse", top_k=3, hot_slots=3), ps, 30, _keep(rb := [], []))
    assert a[1] == b[1] and ra[0].counters() == rb[0].counters()


def test_hot_cache_slots_hold_their_blocks_over_many_steps():
    eng = Engine(cfg("hisparse", top_k=3, hot_slots=7, max_context=1000, max_lanes=2))
    drive(eng, prompts(2, (40, 65)), 500, 100, lambda e: _check_mapping(e.runner, live_lanes(e)))  # both cross
    assert eng.runner.store.S == 7 and eng.runner.counters()["units_fetched"] > 100


@pytest.mark.parametrize("fused_gather", [True, False])
def test_cuda_fetch_path_equals_the_torch_path(fused_gather):
    """Prefetcher._fetch_hot (plan_select with the slot list, and the host read fused in or the UVA gather after
    it), forced on the CPU under the Triton interpreter: the torch path's tokens, logits and counters."""
    ps = prompts(4, (90, 120))
    kw = dict(top_k=3, hot_slots=5, transfer="uva", fused_hot_gather=fused_gather)
    ra, rb = [], []
    ref, out_ref = run_logits(cfg("hisparse", **kw), ps, 8, ra.append)
    hot = []

    def force(r):
        r.pipe.cuda = True  # _fused(): the CUDA selection; nothing else of the step changes
        r.pipe.route = dataclasses.replace(r.pipe.route, path="uva")
        fetch = r.pipe._fetch_hot
        r.pipe._fetch_hot = lambda *a: hot.append(1) or fetch(*a)
        rb.append(r)

    got, out = run_logits(cfg("hisparse", **kw), ps, 8, force)
    assert hot and out == out_ref and ra[0].counters() == rb[0].counters()
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.equal(a, b)


def test_simulator_hot_cache():
    from oasis_sim.config import SimConfig
    from oasis_sim.sim import simulate
    from oasis_sim.workloads import uniform_trace

    tr = uniform_trace(4, 3000, 60, gap_s=0.01)
    base = dict(top_k=16, policy_layers=1, profile_steps=32, timeline_steps=0)
    ret = simulate(SimConfig(mode="retrieval", **base), tr).summary
    same = simulate(SimConfig(mode="hisparse", hot_slots=16, **base), tr).summary
    hot = simulate(SimConfig(mode="hisparse", **base), tr).summary
    assert "hot_hit_rate" not in ret
    assert same["h2d_bytes"] == ret["h2d_bytes"] and same["tpot_ms_p50"] == ret["tpot_ms_p50"]
    assert hot["h2d_bytes"] < ret["h2d_bytes"] and hot["tpot_ms_p50"] < ret["tpot_ms_p50"]
    assert hot["hot_slots"] == 32 and same["hot_hit_rate"] < hot["hot_hit_rate"] <= 1.0
    assert hot["resident_recall"] == 1.0 and hot["stall_ms_total"] == 0
