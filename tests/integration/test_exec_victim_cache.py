"""A victim cache in the background modes (``hot_slots > top_k``): through the executor on the CPU (tiny random model,
float32) and the simulator. It equals dense when the top-K covers every block, equals the plain working set when
``hot_slots == top_k``, attends at most K slots a row, fetches less than the working set on the same run, and keeps
every slot holding its block's host copy across short-context crossings."""

import pytest
import torch
from exec_cases import cfg, drive, live_lanes, prompts, run_logits
from test_exec_engine import _check_mapping

from oasis_core.selection import attend_slots
from oasis_exec.engine.engine import Engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("mode", ["lookahead", "proxy"])
def test_equals_dense_when_top_k_covers_every_block(mode):
    ps = prompts()
    ref, out_ref = run_logits(cfg("dense"), ps, 16)
    got, out = run_logits(cfg(mode, top_k=32, hot_slots=48, fetch_ratio=1.0), ps, 16)
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.allclose(a, b, atol=2e-4, rtol=2e-4), (a - b).abs().max()


def test_hot_slots_equal_to_top_k_is_the_working_set():
    ps = prompts(3, (90, 130))
    a = run_logits(cfg("lookahead", top_k=3, fetch_ratio=0.67), ps, 30, (ra := []).append)
    b = run_logits(cfg("lookahead", top_k=3, hot_slots=3, fetch_ratio=0.67), ps, 30, (rb := []).append)
    assert a[1] == b[1] and ra[0].counters() == rb[0].counters()
    for rid in a[0]:
        assert all(torch.equal(x, y) for x, y in zip(a[0][rid], b[0][rid]))


def _attended(seen):
    """A runner hook recording every attended slot list next to the tables it was taken from."""

    def hook(r):
        slot_ids = r.model.ws.slot_ids

        def kept(l, rows, base, sel_off):
            ids = slot_ids(l, rows, base, sel_off)
            st = r.store
            row_ids = r.pipe.row_ids(rows)
            seen.append((ids.clone(), st.resident[l][row_ids].clone(), st.last_sel[l][row_ids].clone(), row_ids))
            return ids

        r.model.ws.slot_ids = kept

    return hook


def test_victim_cache_attends_k_most_recent_and_fetches_less():
    ps = prompts(5, (150, 200, 260))
    runs = {}
    for hot in (None, 9):
        runners, seen = [], []

        def hook(r, seen=seen, runners=runners):
            runners.append(r)
            _attended(seen)(r)

        _, out = run_logits(cfg("lookahead", top_k=3, hot_slots=hot, fetch_ratio=0.34, max_context=600), ps, 60, hook)
        runs[hot] = (out, runners[0].counters(), seen)
    (_, c_ws, _), (_, c_vc, seen) = runs[None], runs[9]
    assert seen and all(ids.shape[-1] == 3 for ids, *_ in seen)  # K slots a row, not the 9 it holds
    W = 9 + 2
    for ids, res, ls, row_ids in seen:
        want = attend_slots(res, ls, 3)
        want = torch.where(want >= 0, row_ids[:, None] * W + want, -1)
        assert torch.equal(ids.reshape(want.shape).long(), want)
    # the same requests, a cache of 3x the set: blocks that come back are hits
    assert 0 < c_vc["units_fetched"] < 0.8 * c_ws["units_fetched"], (c_vc, c_ws)


def test_victim_slots_hold_their_blocks_over_many_steps():
    eng = Engine(cfg("lookahead", top_k=3, hot_slots=8, fetch_ratio=0.67, max_context=1000, max_lanes=2))
    # both start short and cross
    drive(eng, prompts(2, (40, 65)), 500, 100, lambda e: _check_mapping(e.runner, live_lanes(e)))
    assert eng.runner.store.S == 8 and eng.runner.counters()["units_fetched"] > 100


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(mode="retrieval", hot_slots=8), "only hisparse"),
        (dict(mode="lookahead", top_k=4, hot_slots=3), "must be >= top_k"),
    ],
)
def test_bad_hot_slots_are_refused(kw, match):
    mode = kw.pop("mode")
    with pytest.raises(ValueError, match=match):
        cfg(mode, **kw)


def test_simulator_victim_cache():
    from oasis_sim.config import SimConfig
    from oasis_sim.sim import simulate
    from oasis_sim.workloads import uniform_trace

    tr = uniform_trace(4, 3000, 60, gap_s=0.01)
    base = dict(mode="lookahead", top_k=16, policy_layers=1, profile_steps=32, timeline_steps=0)
    base["synthetic"] = {"preset": "smollm2"}
    ws = simulate(SimConfig(**base), tr).summary
    same = simulate(SimConfig(hot_slots=16, **base), tr).summary
    vc = simulate(SimConfig(hot_slots=48, **base), tr).summary
    assert same["h2d_bytes"] == ws["h2d_bytes"] and same["resident_recall"] == ws["resident_recall"]
    # the cap binds at K = 16 (one block a row a step): fewer bytes, and the blocks that come back are held
    assert vc["h2d_bytes"] < ws["h2d_bytes"] and vc["resident_recall"] > ws["resident_recall"] + 0.05


@pytest.mark.parametrize("marks", [False, True])
def test_fused_selection_equals_the_torch_path(marks):
    """The CUDA selection (plan_select over S = 3K slots; membership by compares, or through its rows of marks),
    forced on the CPU under the Triton interpreter: the torch path's tokens, logits and counters, marks left zero."""
    ps = prompts(6, (90, 120))
    kw = dict(top_k=3, hot_slots=9, fetch_ratio=0.34, plan_marks=marks)
    ra, rb = [], []
    ref, out_ref = run_logits(cfg("lookahead", **kw), ps, 10, ra.append)

    def force(r):
        r.pipe._fused = lambda cap: True  # select() through plan_select; nothing else of the step changes
        rb.append(r)

    got, out = run_logits(cfg("lookahead", **kw), ps, 10, force)
    assert out == out_ref and ra[0].counters() == rb[0].counters()
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.equal(a, b)
    assert (rb[0].pipe.bufs.marks is not None) == marks
    assert not any(m.any() for m in rb[0].pipe.bufs.marks or [])


def test_a_budget_with_room_runs_a_victim_cache_by_default():
    """hot_slots=None in lookahead: the named lanes fit the budget at 3 x top_k, so the store, the engine's slot
    count and the bench record all say 12 slots a row; hot_slots=top_k runs the working set and fetches more."""
    from oasis_core.geometry import KVGeometry
    from oasis_core.specs import get_model
    from oasis_exec.kv.store import SparseStore
    from oasis_exec.tools.bench import run_bench

    geo = KVGeometry(get_model("tiny"), block_size=16, dtype_bytes=4)
    budget = 2 * SparseStore.bytes_per_lane(geo, 12, 20) / 1e9 * 1.01
    recs = {}
    for hot in (None, 4):
        c = cfg("lookahead", max_lanes=2, kv_budget_gb=budget, hot_slots=hot, fetch_ratio=0.5, short_context=False)
        eng = Engine(c)
        assert eng.runner.store.S == (12 if hot is None else 4)
        assert eng.slots_per_lane == 2 * 2 * eng.runner.store.S  # layers x KV heads x slots
        eng.close()
        recs[hot] = run_bench(c, context=200, concurrency=2, steps=12, warmup=2)
    assert recs[None]["hot_slots"] == 12 and recs[4]["hot_slots"] is None
    assert recs[None]["bytes_moved_total"] < recs[4]["bytes_moved_total"]


@pytest.mark.parametrize("extra", [dict(speculative_k=2), dict(decode_chain=4)])
def test_speculative_and_chained_steps_over_a_victim_cache_equal_dense(extra):
    """The default config grows a victim cache wherever a budget has room, speculative and chained steps included:
    with the top-K covering every block their greedy tokens are dense's."""
    ps = prompts()
    _, out_ref = run_logits(cfg("dense", **extra), ps, 12)
    _, out = run_logits(cfg("lookahead", top_k=32, hot_slots=48, fetch_ratio=1.0, **extra), ps, 12)
    assert out == out_ref
