"""plan_select (one-launch Algorithm 2 + copy list) vs its reference built on oasis_core.selection.plan_step."""

import dataclasses

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_core.selection import plan_step
from oasis_kernels.plan_select import PlanSelectOut, plan_select, plan_select_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# the Prefetcher's CUDA path forced on CPU tensors: only the Triton interpreter runs it (on a GPU the kernel takes no
# CPU tensor; the fused path runs natively there in tests/gpu/test_exec_gpu.py)
interpreted = pytest.mark.skipif(
    torch.cuda.is_available(), reason="forces the CUDA path on CPU tensors: runs under the Triton interpreter only"
)


def make_case(g, R_lanes, H, S, K, C, n_extra=3, overlap="mixed", tie_span=3, n_blocks=40, b_max=6):
    """A layer's tables (more rows than planned), the rows planned (a permutation subset), predictions, lanes and a
    host table. overlap: "heavy" (predictions mostly resident), "none" (never resident), "mixed"."""
    R = R_lanes * H
    N = R + n_extra
    res = torch.full((N, S), -1, dtype=torch.int64)
    for i in range(N):
        n = int(torch.randint(0, S + 1, (1,), generator=g))
        slots = torch.randperm(S, generator=g)[:n]  # empty slots anywhere
        res[i, slots] = torch.randperm(n_blocks, generator=g)[:n]
    ls = torch.randint(-tie_span, 1, (N, S), generator=g)  # small span: many equal last_sel ties
    rows = torch.randperm(N, generator=g)[:R]
    pred = torch.full((R, K), -1, dtype=torch.int64)
    for r in range(R):
        held = res[rows[r]][res[rows[r]] >= 0]
        others = torch.tensor([b for b in range(n_blocks) if b not in set(held.tolist())], dtype=torch.int64)
        if overlap == "heavy":
            pool = torch.cat(
                [
                    held[torch.randperm(held.numel(), generator=g)],
                    others[torch.randperm(others.numel(), generator=g)][:2],
                ]
            )
        elif overlap == "none":
            pool = others[torch.randperm(others.numel(), generator=g)]
        else:
            pool = torch.randperm(n_blocks, generator=g)
        n = min(int(torch.randint(0, K + 1, (1,), generator=g)), pool.numel())
        pred[r, :n] = pool[:n]
        if overlap == "mixed" and r % 3 == 0:  # -1 in the middle too (masked like padding)
            pred[r] = pred[r, torch.randperm(K, generator=g)]
    lanes = torch.randperm(b_max, generator=g)[:R_lanes]
    host_table = torch.randperm(b_max * n_blocks * 5, generator=g)[: b_max * n_blocks].view(b_max, n_blocks)
    return res, ls, rows, pred, lanes, host_table


def run_both(res, ls, rows, pred, cap, C, lanes, host_table, H, W, step=0, plan=True, copy=True, out=None, marks=False):
    """Kernel and reference on separate copies of the state; returns both outputs, states and counters. ``marks``:
    the kernel finds membership through a zeroed row of marks a program, which it must leave zeroed."""
    dev_t = [t.to(DEV, copy=True) for t in (res, ls, rows, pred, lanes, host_table)]
    r1, l1, rw, p1, ln, ht = dev_t
    cnt1 = torch.tensor([5, 7], dtype=torch.int64, device=DEV)
    cap1 = cap.to(DEV) if isinstance(cap, torch.Tensor) else cap
    kw = dict(lanes=ln, H=H, W=W, host_table=ht) if copy else {}
    if marks:
        bound = int(max(res.max(), pred.max())) + 1
        kw["marks"] = torch.zeros(rows.shape[0] + 2, bound + 3, dtype=torch.int32, device=DEV)
    got = plan_select(r1, l1, rw, p1, cap1, C, step, counters=cnt1, plan=plan, out=out, **kw)
    if marks:
        assert not kw["marks"].any(), "the marks must be left all zero"
    r2, l2, cnt2 = res.clone(), ls.clone(), torch.tensor([5, 7], dtype=torch.int64)
    kw = dict(lanes=lanes, H=H, W=W, host_table=host_table) if copy else {}
    want = plan_select_ref(r2, l2, rows, pred, cap, C, step, counters=cnt2, plan=plan, **kw)
    return got, want, (r1, l1, cnt1), (r2, l2, cnt2)


def assert_same(got, want, state_got, state_want):
    for name, a, b in zip(PlanSelectOut._fields, got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
            assert torch.equal(a.cpu(), b), (name, a.cpu(), b)
    for name, a, b in zip(("resident", "last_sel", "counters"), state_got, state_want):
        assert torch.equal(a.cpu(), b), (name, a.cpu(), b)


CASES = [  # (lanes, H, S, K, C, overlap)
    (4, 3, 4, 4, 1, "mixed"),
    (6, 2, 8, 8, 3, "heavy"),
    (3, 4, 13, 13, 8, "mixed"),
    (5, 2, 16, 16, 3, "none"),
    (2, 3, 8, 13, 8, "heavy"),
    (3, 2, 13, 4, 3, "none"),
    (4, 1, 16, 8, 1, "mixed"),
    (2, 6, 4, 16, 8, "mixed"),
]


@pytest.mark.parametrize("marks", [False, True])
@pytest.mark.parametrize("lanes,H,S,K,C,overlap", CASES)
def test_plan_select_matches_plan_step(lanes, H, S, K, C, overlap, marks):
    g = torch.Generator().manual_seed(S * 131 + K * 17 + C * 7 + H)
    res, ls, rows, pred, ln, ht = make_case(g, lanes, H, S, K, C, overlap=overlap)
    R = rows.shape[0]
    caps = [
        C,
        0,
        min(1, C),  # ints
        torch.randint(-2, C + 3, (R,), generator=g),  # per row, clipped: < 0 and > max_cap
        torch.tensor([0, 10**12] * (R // 2) + [C] * (R % 2)),
    ]  # 0 and huge (> n_missing; int64 clip)
    for i, cap in enumerate(caps):
        p = pred.to(torch.int32) if i == 1 else pred  # Prefetcher passes int64; int32 works too
        got, want, sg, sw = run_both(res, ls, rows, p, cap, C, ln, ht, H, S + 2, step=-i, marks=marks)
        assert_same(got, want, sg, sw)


@pytest.mark.parametrize("S,K", [(12, 4), (9, 9), (20, 8)])
def test_marks_give_the_slot_list_of_the_compares(S, K):
    """slots_out (the slot of each predicted block after the plan) is the same through the marks as through the
    compares, victim caches (S > K) included."""
    g = torch.Generator().manual_seed(S + K)
    res, ls, rows, pred, ln, ht = make_case(g, 3, 2, S, K, 3, overlap="heavy")
    outs = []
    for marks in (None, torch.zeros(rows.shape[0], 64, dtype=torch.int32, device=DEV)):
        r, l = res.clone().to(DEV), ls.clone().to(DEV)
        so = torch.full((rows.shape[0], K), -7, dtype=torch.int32, device=DEV)
        kw = dict(lanes=ln.to(DEV), H=2, W=S + 2, slots_out=so, marks=marks)
        plan_select(r, l, rows.to(DEV), pred.to(DEV), 3, 3, 0, **kw)
        outs.append((so.cpu(), r.cpu(), l.cpu()))
        assert marks is None or not marks.any()
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert (outs[0][0] >= 0).sum() > 0


def test_plan_select_is_plan_step_of_decremented_last_sel():
    """The kernel's plan fields equal plan_step(resident, last_sel - 1, ...) directly (the Prefetcher contract)."""
    g = torch.Generator().manual_seed(3)
    res, ls, rows, pred, ln, ht = make_case(g, 4, 2, 8, 8, 3)
    r, l = res.clone().to(DEV), ls.clone().to(DEV)
    got = plan_select(r, l, rows.to(DEV), pred.to(DEV), 3, 3, 0, plan=True)
    ref = plan_step(res[rows], ls[rows] - 1, pred, 3, 0, 3)
    for f in ("fetch_block", "fetch_slot", "n_fetch", "n_missing", "n_kept"):
        assert torch.equal(getattr(got, f).cpu(), getattr(ref, f)), f
    assert torch.equal(r[rows.to(DEV)].cpu(), ref.resident) and torch.equal(l[rows.to(DEV)].cpu(), ref.last_sel)
    assert got.src is None and got.n_fetch.sum() > 0


def test_plan_select_without_copy_list_and_into_buffers():
    g = torch.Generator().manual_seed(11)
    res, ls, rows, pred, ln, ht = make_case(g, 3, 2, 8, 8, 3)
    R, C = rows.shape[0], 3
    # no copy list: counters[1] untouched
    got, want, sg, sw = run_both(res, ls, rows, pred, 2, C, ln, ht, 2, 10, copy=False)
    assert_same(got, want, sg, sw)
    assert sg[2][1].item() == 7
    # preallocated (larger) buffers: results are their leading views
    out = PlanSelectOut(
        *(torch.full((R * C + 5,), 99, dtype=dt, device=DEV) for dt in [torch.int32] * 3 + [torch.int64] * 5)
    )
    got, want, sg, sw = run_both(res, ls, rows, pred, 2, C, ln, ht, 2, 10, out=out)
    assert_same(got, want, sg, sw)
    for a, buf in zip(got, out):
        assert a.data_ptr() == buf.data_ptr()
    assert (out.src[R * C :] == 99).all()  # nothing past R * C written
    # max_cap 0: empty copy list, state still updated (keep + decrement)
    got, want, sg, sw = run_both(res, ls, rows, pred, 0, 0, ln, ht, 2, 10)
    assert_same(got, want, sg, sw)
    assert got.src.numel() == 0


def test_plan_select_multi_step():
    """Five steps, each planned on the state the previous step left (in place), predictions drifting."""
    g = torch.Generator().manual_seed(7)
    lanes, H, S, K, C, NB = 3, 2, 8, 8, 3, 24
    res, ls, rows, pred, ln, ht = make_case(g, lanes, H, S, K, C, n_blocks=NB)
    r1, l1, r2, l2 = res.to(DEV, copy=True), ls.to(DEV, copy=True), res.clone(), ls.clone()
    c1, c2 = torch.zeros(2, dtype=torch.int64, device=DEV), torch.zeros(2, dtype=torch.int64)
    total = 0
    for step in range(5):
        cap = C if step % 2 == 0 else torch.randint(0, C + 2, (rows.shape[0],), generator=g)
        got = plan_select(
            r1,
            l1,
            rows.to(DEV),
            pred.to(DEV),
            cap.to(DEV) if step % 2 else cap,
            C,
            0,
            lanes=ln.to(DEV),
            H=H,
            W=S + 2,
            host_table=ht.to(DEV),
            counters=c1,
            plan=True,
        )
        want = plan_select_ref(
            r2, l2, rows, pred, cap, C, 0, lanes=ln, H=H, W=S + 2, host_table=ht, counters=c2, plan=True
        )
        assert_same(got, want, (r1, l1, c1), (r2, l2, c2))
        total += int(want.n_fetch.sum())
        # drift: replace a random suffix of each row's prediction with other blocks (distinct per row)
        nxt = pred.clone()
        for r in range(pred.shape[0]):
            keep = int(torch.randint(0, K + 1, (1,), generator=g))
            fresh = [b for b in torch.randperm(NB, generator=g).tolist() if b not in nxt[r, :keep].tolist()]
            nxt[r, keep:] = torch.tensor(fresh[: K - keep])
        pred = nxt
    assert total > 0
    assert (l2 >= -6).all()  # relative last_sel: one decrement per step


@pytest.mark.gpu
def test_plan_select_gpu_realistic():
    """R = 64 lanes x 8 heads, S = K = 128, C = 7 on the GPU, against the torch reference on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, S, K, C, NB, B_max = 64, 8, 128, 128, 7, 1024, 80
    N = B_max * H
    res = torch.stack([torch.randperm(NB, generator=g, device="cuda")[:S] for _ in range(N)])
    res[::5, 100:] = -1  # some empty slots
    ls = torch.randint(-20, 1, (N, S), generator=g, device="cuda")
    lanes = torch.randperm(B_max, generator=g, device="cuda")[:B]
    rows = (lanes[:, None] * H + torch.arange(H, device="cuda")).reshape(-1)
    # predictions: most of the resident set (shuffled) plus a few new blocks
    pred = torch.empty(B * H, K, dtype=torch.int64, device="cuda")
    for i in range(B * H):
        held = res[rows[i]]
        held = held[held >= 0]
        new = torch.randperm(NB, generator=g, device="cuda")
        new = new[~torch.isin(new, held)][:10]
        cand = torch.cat([held[torch.randperm(held.numel(), generator=g, device="cuda")][: K - 10], new])
        pred[i, : cand.numel()] = cand
        pred[i, cand.numel() :] = -1
    ht = torch.randperm(B_max * NB * 2, generator=g, device="cuda")[: B_max * NB].view(B_max, NB)
    for cap in (C, torch.randint(0, C + 1, (B * H,), generator=g, device="cuda")):
        r1, l1, r2, l2 = res.clone(), ls.clone(), res.clone(), ls.clone()
        c1, c2 = torch.zeros(2, dtype=torch.int64, device="cuda"), torch.zeros(2, dtype=torch.int64, device="cuda")
        kw = dict(lanes=lanes, H=H, W=S + 2, host_table=ht, plan=True)
        got = plan_select(r1, l1, rows, pred, cap, C, 0, counters=c1, **kw)
        want = plan_select_ref(r2, l2, rows, pred, cap, C, 0, counters=c2, **kw)
        torch.cuda.synchronize()
        for name, a, b in zip(PlanSelectOut._fields, got, want):
            assert torch.equal(a, b), name
        assert torch.equal(r1, r2) and torch.equal(l1, l2) and torch.equal(c1, c2)
        assert int(c1[1]) > 0


# -- the Prefetcher's fused path (oasis_exec.workingset.prefetcher): plan_fused / fetch_now against the torch path ---------------


def _prefetcher(B=4, H=2, S=4, L=2, NB=12, max_cap=2, seed=0, policy=None, **kw):
    from oasis_core.fetchcap import Fixed
    from oasis_exec.config import ExecConfig
    from oasis_exec.kv.store import HostPool, SparseStore
    from oasis_exec.workingset.fetch_caps import DeviceCaps
    from oasis_exec.workingset.prefetcher import Prefetcher

    c = ExecConfig(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode="lookahead",
        top_k=S,
        max_context=NB * 16,
        max_lanes=B,
        block_size=16,
        transfer="uva",
        **kw,
    )
    store = SparseStore(L, B, H, S, 16, 16, NB, torch.float32, torch.device("cpu"))
    host = HostPool(L, B * NB, H, 16, 16, torch.float32, pin=False)
    g = torch.Generator().manual_seed(seed)
    for l in range(L):
        host.k[l].copy_(torch.randn(host.k[l].shape, generator=g))
        host.v[l].copy_(torch.randn(host.v[l].shape, generator=g))
        for row in range(B * H):
            n = int(torch.randint(0, S + 1, (1,), generator=g))
            store.resident[l, row, torch.randperm(S, generator=g)[:n]] = torch.randperm(NB - 1, generator=g)[:n]
    store.last_sel.copy_(torch.randint(-3, 1, store.last_sel.shape, generator=g))
    store.host_table.copy_(torch.randperm(B * NB, generator=g).view(B, NB))
    caps = DeviceCaps(
        policy=policy or Fixed(max_cap / S),
        top_k=S,
        n_layers=L,
        bytes_per_block_head=2 * 16 * 16 * 4,
        link_bytes_per_s=30e9,
        device=torch.device("cpu"),
    )
    assert policy is not None or caps.max_cap == max_cap
    return Prefetcher(cfg=c, store=store, host=host, device=torch.device("cpu"), caps=caps), g


def _snapshot(pipe):
    st = pipe.store
    return [t.clone() for t in (st.resident, st.last_sel, pipe.counts, *st.k, *st.v)]


def _restore(pipe, snap):
    st = pipe.store
    for t, s in zip((st.resident, st.last_sel, pipe.counts, *st.k, *st.v), snap):
        t.copy_(s)


@interpreted
@pytest.mark.parametrize("lanes_list", [[0, 1, 2], [3, 0]])
def test_prefetcher_select_fused_equals_torch_select(lanes_list):
    """Prefetcher.select through plan_select (the CUDA path, forced on CPU) == the torch path (plan_step +
    _copy_list): plan fields, copy list, mapping, counters. Contiguous lanes (rows = a slice) and not (rows = an
    index tensor, converted once per step), several steps."""
    pipe, g = _prefetcher()
    st, H = pipe.store, pipe.store.H
    from oasis_exec.workingset.step import rows_index

    lanes = torch.tensor(lanes_list)
    for step in range(3):
        rows = rows_index(lanes_list, H)
        preds = [
            torch.stack([torch.randperm(st.NB - 1, generator=g)[: st.S] for _ in range(len(lanes_list) * H)])
            for _ in range(st.L)
        ]
        for p in preds:
            p[0, 2:] = -1
        snap = _snapshot(pipe)
        pipe._fused = lambda cap: True  # the CUDA gate, on CPU
        got = []
        for l in range(st.L):
            plan = pipe._select_for(l, preds[l], lanes, rows, 0, pipe.caps.max_cap)
            assert plan.src.data_ptr() == pipe.bufs.lists[l].src.data_ptr()  # the preallocated buffers
            got.append(
                [
                    t.clone()
                    for t in (
                        *pipe._plan_list(l, plan, lanes)[:3],
                        plan.fetch_block,
                        plan.fetch_slot,
                        plan.n_fetch,
                        plan.n_missing,
                        plan.n_kept,
                    )
                ]
            )
        del pipe._fused
        after = _snapshot(pipe)
        _restore(pipe, snap)
        for l in range(st.L):
            plan = pipe._select_for(l, preds[l], lanes, rows, 0, pipe.caps.max_cap)
            want = (
                *pipe._plan_list(l, plan, lanes)[:3],
                plan.fetch_block,
                plan.fetch_slot,
                plan.n_fetch,
                plan.n_missing,
                plan.n_kept,
            )
            for i, (a, b) in enumerate(zip(got[l], want)):
                assert torch.equal(a, b), (step, l, i)
        for a, b in zip(after, _snapshot(pipe)):
            assert torch.equal(a, b), step
        assert pipe.missing.data_ptr() == pipe.counts.data_ptr()  # views: counters() readers see the kernel's adds
    assert int(pipe.units) > 0 and int(pipe.missing) >= int(pipe.units)


@interpreted
@pytest.mark.parametrize("path", ["uva", "host"])
def test_prefetcher_fetch_now_fused_equals_reference(path):
    """Retrieval's fetch_now through plan_select (+ uva_gather in the interpreter, or the inline copy) moves the same
    KV into the same slots and counts the same units as the torch path."""
    pipe, g = _prefetcher(seed=1)
    pipe.route = dataclasses.replace(pipe.route, path=path)
    st, H = pipe.store, pipe.store.H
    lanes_list = [2, 0, 1]
    lanes = torch.tensor(lanes_list)
    from oasis_exec.workingset.step import rows_index

    rows = rows_index(lanes_list, H)
    preds = [
        torch.stack([torch.randperm(st.NB - 1, generator=g)[: st.S] for _ in range(len(lanes_list) * H)])
        for _ in range(st.L)
    ]
    snap = _snapshot(pipe)
    pipe._fused = lambda cap: True  # the CUDA gate, on CPU
    for l in range(st.L):
        pipe.fetch_now(l, preds[l], lanes, rows)
    got = _snapshot(pipe)
    _restore(pipe, snap)
    del pipe._fused
    for l in range(st.L):
        pipe.fetch_now(l, preds[l], lanes, rows)
    for i, (a, b) in enumerate(zip(got, _snapshot(pipe))):
        assert torch.equal(a, b), i
    assert int(pipe.units) > 0


@interpreted
def test_retrieval_engine_with_fused_selection_equals_reference():
    """A whole retrieval-mode generation on CPU with fetch_now through plan_select (as on CUDA): same logits, tokens
    and counters as the torch path."""
    from exec_cases import cfg, prompts, run_logits

    c = cfg("retrieval", top_k=3, transfer="uva")
    counters, calls = [], []

    def keep_counters(r):
        close = r.close
        r.close = lambda: (counters.append(r.counters()), close())

    def fused(r):
        keep_counters(r)
        r.pipe._fused = lambda cap: True
        fused_select = r.pipe._select_fused
        r.pipe._select_fused = lambda *a: (calls.append(a[-1] is not None), fused_select(*a))[1]

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref, out_ref = run_logits(c, prompts(2, (40, 70)), 6, keep_counters)
        got, out = run_logits(c, prompts(2, (40, 70)), 6, fused)
    finally:
        torch.set_num_threads(n)
    assert out == out_ref and len(calls) >= 10 and all(calls)  # every call wrote its copy list
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            assert torch.equal(a, b)
    assert counters[0] == counters[1] and counters[0]["units_fetched"] > 0
