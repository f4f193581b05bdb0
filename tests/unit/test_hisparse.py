"""The hisparse mode's parts, one at a time: the hot cache's eviction order is least-recently-used when every step
selects the top-K (the executor's relative last_sel, in torch and in oasis_kernels.plan_select), its configuration checks,
its GPU budget (a larger hot cache holds fewer lanes), the attention's slot list, and plan_select's fused host read."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_core import modes
from oasis_core.geometry import KVGeometry
from oasis_core.selection import plan_step
from oasis_core.specs import get_model
from oasis_exec.config import ExecConfig
from oasis_exec.kv.layout import build_kv_layout
from oasis_exec.kv.store import SparseStore
from oasis_kernels.gather import uva_gather
from oasis_kernels.plan_select import plan_select, plan_select_ref
from oasis_sim.config import ConfigError, SimConfig


def _step(res, ls, pred, k):
    """One executor step on one row: plan_step with last_sel relative to now (Prefetcher.select), uncapped."""
    p = plan_step(res, ls - 1, pred, k, 0, k)
    return p.resident, p.last_sel, p


def test_hot_cache_evicts_the_least_recently_used_block():
    S, K = 3, 1
    res = torch.full((1, S), -1, dtype=torch.int64)
    ls = torch.full((1, S), -1, dtype=torch.int64)
    evicted = []
    for b in (0, 1, 2, 0, 3, 4, 0, 1):
        before = set(res[0].tolist())
        res, ls, p = _step(res, ls, torch.tensor([[b]]), K)
        after = set(res[0].tolist())
        assert b in after and int(p.n_fetch[0]) == int(b not in before)
        evicted += sorted(before - after - {-1})
    # 3 evicts 1 (0 was used again after it), 4 evicts 2, 0 hits, 1 evicts 3 (used before 4 and 0)
    assert evicted == [1, 2, 3]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eviction_is_lru_over_random_top_k_sequences(seed):
    """Whatever leaves the cache was used no later than anything unselected that stays (ties: either may go)."""
    g = torch.Generator().manual_seed(seed)
    S, K, N = 5, 2, 9
    res = torch.full((1, S), -1, dtype=torch.int64)
    ls = torch.full((1, S), -1, dtype=torch.int64)
    used = {}
    for t in range(60):
        pred = torch.randperm(N, generator=g)[:K][None]
        before = set(res[0].tolist()) - {-1}
        res, ls, p = _step(res, ls, pred, K)
        after = set(res[0].tolist()) - {-1}
        sel = set(pred[0].tolist())
        assert sel <= after and len(after) == min(S, len(before | sel))
        assert int(p.n_fetch[0]) == len(sel - before)
        gone, stay = before - after, after - sel
        if gone and stay:
            assert max(used[b] for b in gone) <= min(used[b] for b in stay), (t, gone, stay, used)
        for b in sel:
            used[b] = t


def test_plan_select_kernel_keeps_the_same_lru_order():
    """The CUDA selection (oasis_kernels.plan_select, interpreted here) evicts as plan_step does over a hot cache."""
    g = torch.Generator().manual_seed(3)
    R, S, K, N = 2, 4, 2, 8
    res_t = torch.full((R, S), -1, dtype=torch.int64)
    ls_t = torch.full((R, S), -1, dtype=torch.int64)
    res_k, ls_k = res_t.clone(), ls_t.clone()
    rows = torch.arange(R)
    for _ in range(6):
        pred = torch.stack([torch.randperm(N, generator=g)[:K] for _ in range(R)])
        p = plan_step(res_t, ls_t - 1, pred, K, 0, K)
        res_t, ls_t = p.resident, p.last_sel
        plan_select(res_k, ls_k, rows, pred, K, K, 0)
        assert torch.equal(res_k, res_t) and torch.equal(ls_k, ls_t)


def test_hot_slots_defaults_and_checks():
    c = ExecConfig(mode="hisparse", device="cpu", top_k=8)
    assert c.mode_spec.hot_cache and c.resident_slots == 16
    assert ExecConfig(mode="hisparse", device="cpu", top_k=8, hot_slots=8).resident_slots == 8
    assert ExecConfig(mode="retrieval", device="cpu", top_k=8).resident_slots == 8
    with pytest.raises(ValueError, match=r"ExecConfig.hot_slots: must be >= top_k \(8\).*got 7"):
        ExecConfig(mode="hisparse", device="cpu", top_k=8, hot_slots=7)
    with pytest.raises(ValueError, match="ExecConfig.hot_slots: only hisparse.*background modes.*retrieval"):
        ExecConfig(mode="retrieval", device="cpu", top_k=8, hot_slots=16)
    # a background mode's victim cache (tests/integration/test_exec_victim_cache.py)
    assert ExecConfig(mode="lookahead", device="cpu", top_k=8).resident_slots == 8
    assert ExecConfig(mode="lookahead", device="cpu", top_k=8, hot_slots=24).resident_slots == 24
    assert SimConfig(mode="hisparse", top_k=8).resident_slots == 16
    with pytest.raises(ConfigError, match="hot_slots: must be >= top_k"):
        SimConfig(mode="hisparse", top_k=8, hot_slots=4)
    with pytest.raises(ConfigError, match="hot_slots: only hisparse"):
        SimConfig(mode="retrieval", hot_slots=200)
    assert SimConfig(mode="lookahead", hot_slots=384).resident_slots == 384
    assert [n for n, m in modes.REGISTRY.items() if m.hot_cache] == ["hisparse"]


def test_the_gpu_budget_counts_the_hot_cache():
    """Same budget: hisparse's lanes hold hot_slots blocks a row, so fewer lanes fit than retrieval's."""
    shape = get_model("tiny")
    kw = dict(model="tiny", device="cpu", dtype="float32", top_k=4, block_size=16, max_context=320, host_requests=1)
    geo = KVGeometry(shape, block_size=16, dtype_bytes=4)
    lanes = {}
    for mode, hot in (("retrieval", None), ("hisparse", None), ("hisparse", 12)):
        c = ExecConfig(
            mode=mode, hot_slots=hot, kv_budget_gb=1e-9 * 20.5 * SparseStore.bytes_per_lane(geo, 4, 20), **kw
        )
        kv = build_kv_layout(c, shape=shape, dtype=torch.float32, device=torch.device("cpu"))
        assert kv.lane_bytes == SparseStore.bytes_per_lane(geo, c.resident_slots, c.max_blocks)
        assert kv.store.S == c.resident_slots and kv.store.W == c.resident_slots + 2
        lanes[(mode, hot)] = kv.max_lanes
    assert lanes[("retrieval", None)] == 20
    assert lanes[("retrieval", None)] > lanes[("hisparse", None)] > lanes[("hisparse", 12)] >= 1


def test_selected_slots_lists_the_predicted_blocks_slots():
    st = SparseStore(1, 2, 2, 4, 4, 8, 10, torch.float32, "cpu")
    st.resident[0, :] = torch.tensor([[3, -1, 7, 1], [5, 6, 2, 0], [9, 4, -1, -1], [8, -1, -1, 2]])
    lanes = torch.tensor([0, 1])
    pred = torch.tensor([[7, 3], [0, -1], [4, 9], [2, 8]])
    got = st.selected_slots(0, slice(0, 4), pred, st.slot_base(lanes))
    W = st.W
    want = torch.tensor([[[2, 0], [W + 3, -1]], [[2 * W + 1, 2 * W + 0], [3 * W + 3, 3 * W + 0]]], dtype=torch.int32)
    assert torch.equal(got, want)
    pred[0, 0] = 5  # not resident in row 0: not attended
    assert st.selected_slots(0, slice(0, 4), pred, st.slot_base(lanes))[0, 0, 0] == -1


def test_plan_select_fused_host_read_equals_the_two_launches():
    """gather= (misses read from the host pool in the plan's launch) and slots_out= against the reference and
    against plan_select + uva_gather, at tiny shapes under the interpreter."""
    g = torch.Generator().manual_seed(0)
    B, H, S, K, NB, bs, D = 2, 2, 6, 3, 12, 4, 8
    W, R = S + 2, B * H
    res = torch.full((R, S), -1, dtype=torch.int64)
    for r in range(R):
        res[r, :4] = torch.randperm(NB, generator=g)[:4]
    ls = torch.randint(-3, 1, (R, S), generator=g)
    pred = torch.stack([torch.randperm(NB, generator=g)[:K] for _ in range(R)])
    pred[0, 2] = -1
    lanes, rows = torch.tensor([1, 0]), torch.tensor([2, 3, 0, 1])
    ht = torch.randperm(40, generator=g)[: 3 * NB].view(3, NB)
    hk, hv = torch.randn(40, H, bs, D, generator=g), torch.randn(40, H, bs, D, generator=g)
    ks0, vs0 = torch.randn(3 * H * W, bs, D, generator=g), torch.randn(3 * H * W, bs, D, generator=g)
    outs = []
    for how in ("fused", "reference", "two launches"):
        r_, l_, ks, vs = res.clone(), ls.clone(), ks0.clone(), vs0.clone()
        so, cnt = torch.full((R, K), -7, dtype=torch.int32), torch.zeros(2, dtype=torch.int64)
        kw = dict(lanes=lanes, H=H, W=W, host_table=ht, counters=cnt, slots_out=so)
        if how == "fused":
            plan_select(r_, l_, rows, pred, K, K, 0, gather=(hk, hv, ks, vs), **kw)
        elif how == "reference":
            plan_select_ref(r_, l_, rows, pred, K, K, 0, gather=(hk, hv, ks, vs), **kw)
        else:
            o = plan_select(r_, l_, rows, pred, K, K, 0, **kw)
            uva_gather(hk, hv, o.src, o.head, o.dst, ks, vs)
        outs.append((r_, l_, ks, vs, so, cnt))
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert torch.equal(a, b)
    r_, _, ks, _, so, cnt = outs[0]
    assert int(cnt[1]) > 0 and not torch.equal(ks, ks0)  # something was read from the host
    for r in range(R):  # each listed slot holds its predicted block's host copy
        lane, h = int(lanes[r // H]), r % H
        for k in range(K):
            b = int(pred[r, k])
            assert (int(so[r, k]) >= 0) == (b >= 0)
            if b >= 0:
                s = int(so[r, k])
                assert s // W == lane * H + h and int(r_[rows[r], s % W]) == b
