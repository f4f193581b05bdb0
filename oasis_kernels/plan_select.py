"""One-launch selection + copy list of a layer: ``oasis_core.selection.plan_step`` (paper Algorithm 2) and
``Prefetcher._copy_list`` fused into one Triton program per row.

A *row* is one (lane, KV head) of the layer. Per program ``r`` (R = B * H programs, row ``r`` = lane ``r // H``,
head ``r % H``):

- reads ``res = resident[rows[r]]`` and ``ls = last_sel[rows[r]] - 1`` (last_sel is kept relative to the current
  step: one decrement per step, folded in here) and ``pred[r]`` (best first, -1 padded);
- plans exactly what ``plan_step(res, ls, pred, cap, step, max_cap)`` plans: ``keep = P ∩ R``; ``missing = P \\ R``
  in prediction order (ranks by ``tl.cumsum``); victims ``R \\ P``: empty slots first (lower slot first), then
  least-recently-selected (ties: lower slot), the first ``admit`` found by one min-reduction each (no sort);
  ``admit = min(n_missing, clip(cap, 0, max_cap), n_victims)``; ``missing[j]`` goes into ``victims[j]``, ``j < admit``;
- writes the row's ``resident`` / ``last_sel`` back in place (a program owns its row);
- writes the layer's copy list in ``oasis_kernels.gather.uva_gather``'s format, flat row-major [R, C] int32:
  ``src = host_table[lanes[b], fetch_block]``, ``head = h``, ``dst = (lanes[b] * H + h) * W + fetch_slot``, with
  ``src = dst = -1`` for ``j >= admit`` (``head`` is ``h`` everywhere, as in ``_copy_list``);
- optionally writes the ``StepPlan`` fields ``fetch_block`` / ``fetch_slot`` [R, C] and ``n_fetch`` / ``n_missing`` /
  ``n_kept`` [R] (int64);
- optionally adds ``n_missing`` and ``n_fetch`` (the live copies, when a copy list is written) atomically into an
  int64 ``counters[2]`` tensor, so the host needs no per-layer reductions;
- optionally (``slots_out``) writes the slot of each predicted block after the plan, ``(lane * H + h) * W + s``
  (-1: padding, or a block the cap left out): the attention's slot list of a hot cache (hisparse), whose rows hold
  more blocks than the step attends;
- optionally (``gather``) copies the row's admitted blocks from the (pinned, read through UVA) host pool into their
  slots in the same program: hisparse's find-misses + read-from-host in one launch, no copy list round trip. The
  program copies its row's blocks one after another (``bs * D`` elements of K and of V each), so a row with many
  misses is a serial tail; the two-launch path (this without ``gather``, then ``oasis_kernels.gather.uva_gather`` of the
  list) spreads the copies over the gather's persistent programs instead. Neither was timed on a GPU yet.

Shapes S (slots), K (predicted), C (max_cap) are arbitrary (padded to powers of two with masks). No host sync.
The [S, K] membership compares run over chunks of ``chunk`` slots / predictions (reloaded from memory, before the
in-place stores): at S = K = 128 that is 111 registers and no spills at 4 warps on sm_90 (the unchunked form took 255
registers and spilled). The victims are found one at a time, ``admit`` min-reductions of an int64 key over the row
(empty slots by slot, then ``last_sel``, then the slot; ``last_sel`` clamped at ``-2**40``, so rows ranked by older
selections than 2**40 steps tie there): C x S work instead of ranking every candidate against every other (S x S),
which made a victim cache of S = 3K slots (``ExecConfig.hot_slots``) 2.3x slower a launch at 16K x 44 (213 against
93 us, ``experiments/dense_vs_lookahead_throughput/victim_kernels.py`` at 48f3192). With ``marks`` (a zeroed
int32 row a program, indexed by block id; ``ExecConfig.plan_marks``) the membership is O(S + K) stores and loads
instead of the S x K compares: alone on the H200 at S = 3K, 93 against 111 us a launch at 352 rows (55 against 74 at
384), and 1.9 ms shorter a 16K x 44 token beside the step, where the compares held SMs the layers wait for
(``experiments/dense_vs_lookahead_throughput/results/victim_lanes_f1fc382/``). Rows must be distinct (each program
owns its row).
"""

from __future__ import annotations

from numbers import Integral
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._util import check, next_pow2


class PlanSelectOut(NamedTuple):
    """Outputs of ``plan_select`` (None where not requested). Copy list: [R * C] int32; plan fields int64."""

    src: torch.Tensor | None
    head: torch.Tensor | None
    dst: torch.Tensor | None
    fetch_block: torch.Tensor | None  # [R, C]
    fetch_slot: torch.Tensor | None  # [R, C]
    n_fetch: torch.Tensor | None  # [R]
    n_missing: torch.Tensor | None  # [R]
    n_kept: torch.Tensor | None  # [R]


@triton.jit
def plan_select_kernel(
    RES,
    LS,
    ROWS,
    PRED,
    CAP,
    LANES,
    HT,
    SRC,
    HEAD,
    DST,
    FB,
    FS,
    NF,
    NM,
    NK,
    CNT,
    HK,
    HV,
    KS,
    VS,
    SLOT_OUT,
    MK,
    cap_scalar,
    step,
    H,
    W,
    S,
    K,
    C,
    stride_res,
    stride_ls,
    stride_pr,
    stride_pk,
    stride_ht,
    stride_hkb,
    stride_hkh,
    stride_hvb,
    stride_hvh,
    stride_ks,
    stride_vs,
    stride_mk,
    SP: tl.constexpr,
    KP: tl.constexpr,
    CP: tl.constexpr,
    TB: tl.constexpr,
    KB: tl.constexpr,
    CAP_T: tl.constexpr,
    COPY: tl.constexpr,
    PLAN: tl.constexpr,
    COUNT: tl.constexpr,
    GATHER: tl.constexpr,
    SLOTS: tl.constexpr,
    MARKS: tl.constexpr,
    CHUNK: tl.constexpr,
    CHUNK_P: tl.constexpr,
):
    r = tl.program_id(0)
    row = tl.load(ROWS + r).to(tl.int64)
    offs_s = tl.arange(0, SP)
    offs_k = tl.arange(0, KP)
    offs_c = tl.arange(0, CP)
    s_ok = offs_s < S
    k_ok = offs_k < K
    c_ok = offs_c < C

    res = tl.load(RES + row * stride_res + offs_s, mask=s_ok, other=-1).to(tl.int64)
    ls = tl.load(LS + row * stride_ls + offs_s, mask=s_ok, other=0).to(tl.int64) - 1
    pred = tl.load(PRED + r.to(tl.int64) * stride_pr + offs_k * stride_pk, mask=k_ok, other=-1).to(tl.int64)
    res_valid = s_ok & (res >= 0)
    pred_valid = k_ok & (pred >= 0)

    if MARKS:
        # Membership through this program's row of marks, indexed by block id (all zero between launches): O(S + K)
        # stores and loads instead of S x K compares. Predicted blocks mark -(k + 1), read at the resident ids (keep);
        # then resident blocks mark s + 1 over them, read at the predicted ids (in_res, at_slot); then all back to 0.
        mrow = MK + r.to(tl.int64) * stride_mk
        tl.store(mrow + tl.where(pred_valid, pred, 0), -(offs_k + 1), mask=pred_valid)
        tl.debug_barrier()
        v = tl.load(mrow + tl.where(res_valid, res, 0), mask=res_valid, other=0)
        keep = res_valid & (v < 0)
        tl.debug_barrier()
        tl.store(mrow + tl.where(res_valid, res, 0), offs_s + 1, mask=res_valid)
        tl.debug_barrier()
        w = tl.load(mrow + tl.where(pred_valid, pred, 0), mask=pred_valid, other=0)
        in_res = (pred_valid & (w > 0)).to(tl.int32)
        at_slot = tl.where(pred_valid & (w > 0), w - 1, -1).to(tl.int32)
        tl.debug_barrier()
        tl.store(mrow + tl.where(pred_valid, pred, 0), tl.zeros([KP], dtype=tl.int32), mask=pred_valid)
        tl.store(mrow + tl.where(res_valid, res, 0), tl.zeros([SP], dtype=tl.int32), mask=res_valid)
    else:
        # Membership, chunked so no [S, K] tensor is live at once (registers at S = K = 128).
        # keep[s] = resident block s is predicted: over chunks of the prediction (reloaded from memory).
        keep_i = tl.zeros([SP], dtype=tl.int32)
        for k0 in range(0, KP, KB):
            offs_kb = k0 + tl.arange(0, KB)
            pk = tl.load(PRED + r.to(tl.int64) * stride_pr + offs_kb * stride_pk, mask=offs_kb < K, other=-1)
            pk = pk.to(tl.int64)
            m = (res[:, None] == pk[None, :]) & res_valid[:, None] & (pk >= 0)[None, :]
            keep_i = tl.maximum(keep_i, tl.max(m.to(tl.int32), axis=1))
        keep = keep_i > 0
        # Over chunks t of the slots (reloaded): the predicted blocks resident there (and in which slot).
        in_res = tl.zeros([KP], dtype=tl.int32)
        at_slot = tl.full([KP], -1, dtype=tl.int32)  # the slot a predicted block is resident in (SLOTS)
        for t0 in range(0, SP, TB):
            offs_t = t0 + tl.arange(0, TB)
            t_ok = offs_t < S
            rt = tl.load(RES + row * stride_res + offs_t, mask=t_ok, other=-1).to(tl.int64)
            rt_valid = t_ok & (rt >= 0)
            m = ((rt[:, None] == pred[None, :]) & rt_valid[:, None] & pred_valid[None, :]).to(tl.int32)
            in_res = tl.maximum(in_res, tl.max(m, axis=0))
            if SLOTS:
                at_slot = tl.maximum(at_slot, tl.max(tl.where(m > 0, offs_t[:, None], -1), axis=0))
    cand = s_ok & ~keep
    missing = pred_valid & (in_res == 0)  # [KP]
    miss_i = missing.to(tl.int32)
    n_missing = tl.sum(miss_i, axis=0)
    n_kept = tl.sum(keep.to(tl.int32), axis=0)
    miss_rank = tl.cumsum(miss_i, axis=0) - miss_i  # j of missing block k (prediction order)
    n_victims = S - n_kept

    if CAP_T:
        cap = tl.load(CAP + r).to(tl.int64)  # clipped in int64: a huge cap must not wrap
    else:
        cap = cap_scalar
    cap = tl.minimum(tl.maximum(cap, 0), C)
    admit = tl.minimum(tl.minimum(n_missing, cap), n_victims)

    # The j-th missing block ([C, K] one-hot) and the j-th victim slot, j < admit. Victims in order: empty slots (by
    # slot), then least recently selected (ties: the lower slot), as one int64 key; kept slots never. The first
    # `admit` by one min-reduction each: C x S work, where ranking every candidate took S x S (4x at S = 2K).
    live = c_ok & (offs_c < admit)
    pick_b = missing[None, :] & (miss_rank[None, :] == offs_c[:, None])
    fb = tl.sum(tl.where(pick_b, pred[None, :], 0), axis=1)
    lsc = tl.maximum(ls, -(2**40)) + 2**40  # [0, 2**40): last_sel clamped (reached after 2**40 steps)
    vkey = tl.where(res_valid, (1 << 61) + (lsc << 20), 0) + offs_s.to(tl.int64)
    vkey = tl.where(cand, vkey, 1 << 62)
    fs = tl.full([CP], -1, dtype=tl.int64)
    for j in range(0, admit.to(tl.int32)):
        slot = tl.min(vkey, axis=0) & 0xFFFFF
        fs = tl.where(offs_c == j, slot, fs)
        vkey = tl.where(offs_s == slot, 1 << 62, vkey)
    fb = tl.where(live, fb, -1)
    fs = tl.where(live, fs, -1)

    # Apply: slot fs[j] takes block fb[j] ([S, C] one-hot); kept and filled slots are selected now.
    hit = (offs_s[:, None] == fs[None, :]) & live[None, :]
    filled = tl.max(hit.to(tl.int32), axis=1) > 0
    new_blk = tl.sum(tl.where(hit, fb[None, :], 0), axis=1)
    new_res = tl.where(filled, new_blk, res)
    new_ls = tl.where(keep | filled, step, ls)
    tl.store(RES + row * stride_res + offs_s, new_res, mask=s_ok)
    tl.store(LS + row * stride_ls + offs_s, new_ls, mask=s_ok)

    out_c = r.to(tl.int64) * C + offs_c
    if COPY:
        b = r // H
        h = r - b * H
        lane = tl.load(LANES + b).to(tl.int64)
        src = tl.load(HT + lane * stride_ht + tl.where(live, fb, 0), mask=live, other=-1)
        dst = (lane * H + h) * W + fs
        tl.store(SRC + out_c, tl.where(live, src, -1).to(tl.int32), mask=c_ok)
        tl.store(HEAD + out_c, tl.zeros([CP], dtype=tl.int32) + h, mask=c_ok)
        tl.store(DST + out_c, tl.where(live, dst, -1).to(tl.int32), mask=c_ok)
    if PLAN:
        tl.store(FB + out_c, fb, mask=c_ok)
        tl.store(FS + out_c, fs, mask=c_ok)
        tl.store(NF + r, admit.to(tl.int64))
        tl.store(NM + r, n_missing.to(tl.int64))
        tl.store(NK + r, n_kept.to(tl.int64))
    if COUNT:
        tl.atomic_add(CNT, n_missing.to(tl.int64))
        if COPY:
            tl.atomic_add(CNT + 1, admit.to(tl.int64))
    if SLOTS:  # where each predicted block lives after the plan: kept in place, or the victim slot it was given
        b2 = r // H
        h2 = r - b2 * H
        base = (tl.load(LANES + b2).to(tl.int64) * H + h2) * W
        got = pick_b & live[:, None]  # [C, K]: admitted missing block k went into fs[c]
        new_at = tl.sum(tl.where(got, fs[:, None], 0), axis=0)
        admitted = tl.max(got.to(tl.int32), axis=0) > 0
        at = tl.where(in_res > 0, at_slot.to(tl.int64), tl.where(admitted, new_at, -1))
        out = tl.where(pred_valid & (at >= 0), base + at, -1)
        tl.store(SLOT_OUT + r.to(tl.int64) * K + offs_k, out.to(tl.int32), mask=k_ok)
    if GATHER:  # the admitted blocks read from the (pinned) host pool into their slots, by this program
        b3 = r // H
        h3 = (r - b3 * H).to(tl.int64)
        lane3 = tl.load(LANES + b3).to(tl.int64)
        offs_e = tl.arange(0, CHUNK_P)
        e_ok = offs_e < CHUNK
        for j in range(0, CP):
            pick = offs_c == j
            ok = j < admit
            blk = tl.sum(tl.where(pick, fb, 0), axis=0)
            slot = tl.sum(tl.where(pick, fs, 0), axis=0)
            hb = tl.load(HT + lane3 * stride_ht + tl.where(ok, blk, 0), mask=ok, other=0).to(tl.int64)
            dslot = (lane3 * H + h3) * W + tl.where(ok, slot, 0)
            m = e_ok & ok
            kv = tl.load(HK + hb * stride_hkb + h3 * stride_hkh + offs_e, mask=m)
            tl.store(KS + dslot * stride_ks + offs_e, kv, mask=m)
            vv = tl.load(HV + hb * stride_hvb + h3 * stride_hvh + offs_e, mask=m)
            tl.store(VS + dslot * stride_vs + offs_e, vv, mask=m)


def plan_select(
    resident,
    last_sel,
    rows,
    pred,
    cap,
    max_cap,
    step=0,
    *,
    lanes=None,
    H=None,
    W=None,
    host_table=None,
    counters=None,
    plan=False,
    out=None,
    gather=None,
    slots_out=None,
    marks=None,
    chunk=16,
    num_warps=4,
) -> PlanSelectOut:
    """Plan one step of Algorithm 2 for ``rows`` of a layer in place and write its copy list.

    resident, last_sel: int64 [N_rows, S] (the layer's tables, last dim contiguous), updated in place at ``rows``;
    rows: int64 [R] distinct row indices (program r plans row ``rows[r]``; a slice ``lo:hi`` of the table is
    ``arange(lo, hi)``); pred: int32/int64 [R, K], best first, -1 padded;
    cap: int in [0, max_cap] or integer tensor [R] (clipped to [0, max_cap]); step: written into ``last_sel`` of
    kept and filled slots (the others get ``last_sel - 1``).
    Copy list (when ``host_table`` is given): lanes int [B] with ``R == B * H``, ``W`` slots per row of the slot
    pool, host_table int64 [B_max, NB] (host block of each lane's logical block). plan=True also returns the
    ``StepPlan`` fields. counters: int64 [2] on the device, += (sum n_missing, sum live copies); the second only with
    a copy list.
    out: a ``PlanSelectOut`` of preallocated buffers of at least the needed sizes (flat [>= R * C] for the copy
    list, [>= R * C] or [>= R, C] for fetch_block/fetch_slot, [>= R] for the counts): the results are their leading
    views (stable addresses for CUDA-graph capture).
    gather: ``(host_k, host_v, k_slots, v_slots)`` (``oasis_kernels.gather.uva_gather``'s pool and slots; needs the copy
    list's arguments): each program also copies its row's admitted blocks from the host pool into their slots, in
    the same launch (hisparse's find-misses + read-from-host; the two-launch path is this without ``gather``, then
    ``uva_gather`` of the list). slots_out: int32 [R, K], written with the slot of each predicted block after the
    plan (``(lane * H + h) * W + s``; -1 for padding and for a block left out by the cap): the attention's slot list
    of a hot cache (``SparseStore.selected_slots`` in torch).
    marks: int32 [>= R, NB], all zero, NB above every block id of ``resident`` and ``pred``: membership through a
    row of marks a program (O(S + K)) instead of S x K compares; left all zero again. One launch at a time may use a
    marks tensor (a stream's launches are in order).
    """
    N, S = resident.shape
    dev = resident.device
    assert S < 2**20, f"S ({S}) must be < 2**20 (the victims' key holds the slot in 20 bits)"
    check(resident, "resident", (N, S), torch.int64, dev)
    check(last_sel, "last_sel", (N, S), torch.int64, dev)
    R = rows.shape[0]
    check(rows, "rows", (R,), (torch.int64, torch.int32), dev)
    K = pred.shape[-1]
    check(pred, "pred", (R, K), (torch.int64, torch.int32), dev, inner_contiguous=0)
    C = int(max_cap)
    if C < 0:
        raise ValueError(f"max_cap: must be >= 0, got {max_cap}")
    cap_t = None
    if isinstance(cap, Integral):
        if not 0 <= cap <= C:
            raise ValueError(f"cap: must be in [0, max_cap={C}], got {cap}")
    else:
        cap_t = cap
        check(cap_t, "cap", (R,), (torch.int64, torch.int32), dev)
    copy = host_table is not None
    if copy:
        assert lanes is not None and H is not None and W is not None, "a copy list needs lanes, H and W"
        assert lanes.dim() == 1 and lanes.shape[0] * H == R, (
            f"rows: R={R} must be lanes ({tuple(lanes.shape)}) x H ({H})"
        )
        check(lanes, "lanes", (R // H,), (torch.int64, torch.int32), dev)
        check(host_table, "host_table", (None, None), (torch.int64, torch.int32), dev)
    if counters is not None:
        check(counters, "counters", (2,), torch.int64, dev)
    if gather is not None:
        assert copy, "gather needs the copy list's lanes, H, W and host_table"
    if slots_out is not None:
        assert lanes is not None and H is not None and W is not None, "slots_out needs lanes, H and W"
        assert lanes.dim() == 1 and lanes.shape[0] * H == R, f"rows: R={R} must be lanes x H ({H})"
        check(lanes, "lanes", (R // H,), (torch.int64, torch.int32), dev)
        check(slots_out, "slots_out", (R, K), torch.int32, dev)
    if marks is not None:
        check(marks, "marks", (None, None), torch.int32, dev)
        assert marks.shape[0] >= R, f"marks: need >= {R} rows, got {marks.shape[0]}"
    chunk_e = 1
    if gather is not None:
        from .gather import _check_pool_and_slots, _host_arg

        host_k, host_v, k_slots, v_slots = gather
        _nb, _h, BS, D = _check_pool_and_slots(host_k, host_v, k_slots, v_slots)
        chunk_e = BS * D

    def buf(name, shape, dtype):
        t = getattr(out, name) if out is not None else None
        n = 1
        for x in shape:
            n *= x
        if t is None:
            return torch.empty(shape, dtype=dtype, device=dev)
        assert t.dtype == dtype and t.device == dev and t.is_contiguous() and t.numel() >= n, (
            f"out.{name}: need a contiguous {dtype} buffer of >= {n} elements on {dev}"
        )
        return t.view(-1)[:n].view(shape)

    src = head = dst = fb = fs = nf = nm = nk = None
    if copy:
        src, head, dst = (buf(n, (R * C,), torch.int32) for n in ("src", "head", "dst"))
    if plan:
        fb, fs = (buf(n, (R, C), torch.int64) for n in ("fetch_block", "fetch_slot"))
        nf, nm, nk = (buf(n, (R,), torch.int64) for n in ("n_fetch", "n_missing", "n_kept"))
    if R > 0:
        dummy = resident
        SP, KP = next_pow2(max(S, 1)), next_pow2(max(K, 1))
        plan_select_kernel[(R,)](
            resident,
            last_sel,
            rows,
            pred,
            cap_t if cap_t is not None else dummy,
            lanes if copy or slots_out is not None else dummy,
            host_table if copy else dummy,
            src if copy else dummy,
            head if copy else dummy,
            dst if copy else dummy,
            fb if plan else dummy,
            fs if plan else dummy,
            nf if plan else dummy,
            nm if plan else dummy,
            nk if plan else dummy,
            counters if counters is not None else dummy,
            _host_arg(host_k) if gather is not None else dummy,
            _host_arg(host_v) if gather is not None else dummy,
            k_slots if gather is not None else dummy,
            v_slots if gather is not None else dummy,
            slots_out if slots_out is not None else dummy,
            marks if marks is not None else dummy,
            0 if cap_t is not None else int(cap),
            int(step),
            int(H or 1),
            int(W or 0),
            S,
            K,
            C,
            resident.stride(0),
            last_sel.stride(0),
            pred.stride(0),
            pred.stride(1) if K else 1,
            host_table.stride(0) if copy else 0,
            host_k.stride(0) if gather is not None else 0,
            host_k.stride(1) if gather is not None else 0,
            host_v.stride(0) if gather is not None else 0,
            host_v.stride(1) if gather is not None else 0,
            k_slots.stride(0) if gather is not None else 0,
            v_slots.stride(0) if gather is not None else 0,
            marks.stride(0) if marks is not None else 0,
            SP=SP,
            KP=KP,
            CP=next_pow2(max(C, 1)),
            TB=min(SP, chunk),
            KB=min(KP, chunk),
            CAP_T=cap_t is not None,
            COPY=copy,
            PLAN=plan,
            COUNT=counters is not None,
            GATHER=gather is not None,
            SLOTS=slots_out is not None,
            MARKS=marks is not None,
            CHUNK=chunk_e,
            CHUNK_P=next_pow2(chunk_e),
            num_warps=num_warps,
        )
    return PlanSelectOut(src, head, dst, fb, fs, nf, nm, nk)


def plan_select_ref(
    resident,
    last_sel,
    rows,
    pred,
    cap,
    max_cap,
    step=0,
    *,
    lanes=None,
    H=None,
    W=None,
    host_table=None,
    counters=None,
    plan=False,
    gather=None,
    slots_out=None,
) -> PlanSelectOut:
    """Torch reference of ``plan_select``, built on ``oasis_core.selection.plan_step`` (same arguments, same
    in-place updates and outputs; ``gather`` by plain indexing, ``slots_out`` from the updated table)."""
    from oasis_core.selection import plan_step

    rows = rows.long()
    C = int(max_cap)
    if not isinstance(cap, Integral):
        cap = cap.long()
    p = plan_step(resident[rows], last_sel[rows] - 1, pred.long(), cap, int(step), C)
    resident[rows] = p.resident
    last_sel[rows] = p.last_sel
    src = head = dst = None
    live = p.fetch_block >= 0
    if host_table is not None:
        R = rows.shape[0]
        lane_r = lanes.long().repeat_interleave(H)[:, None].expand(-1, C)
        hd = torch.arange(H, device=resident.device).repeat(R // H)[:, None].expand(-1, C)
        s = host_table[lane_r, p.fetch_block.clamp(min=0)]
        d = (lane_r * H + hd) * W + p.fetch_slot.clamp(min=0)
        neg = torch.full_like(s, -1)
        src = torch.where(live, s, neg).to(torch.int32).reshape(-1)
        head = hd.to(torch.int32).reshape(-1)
        dst = torch.where(live, d, neg).to(torch.int32).reshape(-1)
    if counters is not None:
        counters[0] += p.n_missing.sum()
        if host_table is not None:
            counters[1] += live.sum()
    if gather is not None:
        host_k, host_v, k_slots, v_slots = gather
        ok = (src >= 0) & (dst >= 0)
        s_, h_, d_ = src[ok].long().cpu(), head[ok].long().cpu(), dst[ok].long().to(k_slots.device)
        k_slots[d_] = host_k[s_, h_].to(k_slots.device)
        v_slots[d_] = host_v[s_, h_].to(v_slots.device)
    if slots_out is not None:
        res, pr = resident[rows], pred.long()
        hit = (res[:, None, :] == pr[:, :, None]) & (pr >= 0)[:, :, None]  # [R, K, S]
        s_at = torch.where(hit.any(-1), hit.to(torch.int64).argmax(-1), -1)
        n_r = rows.shape[0]
        base = (lanes.long().repeat_interleave(H) * H + torch.arange(H, device=res.device).repeat(n_r // H)) * W
        slots_out.copy_(torch.where(s_at >= 0, base[:, None] + s_at, -1).to(torch.int32))
    if not plan:
        return PlanSelectOut(src, head, dst, None, None, None, None, None)
    return PlanSelectOut(src, head, dst, p.fetch_block, p.fetch_slot, p.n_fetch, p.n_missing, p.n_kept)
