"""The speculative step's repair prediction (issue 40, ``spec_predict = "beside"``) in one launch a layer: the filled
block's one score, ``oasis_core.spec_predict.merge_block`` and ``repair_pred``, one program a row.

``SpecPipeline.repair`` (``oasis_exec.workingset.spec_pipeline``) runs after the acceptance, for every layer, on the
critical path after the verify pass. In torch it is a few dozen tiny kernels a layer (the gathers of the accepted
query and the filled block's summaries, its score, merge_block's selects and gathers, the resident gather,
repair_pred's two broadcast compares, a sort): 4.2 ms a step on the H100 at 36 layers x 352 rows (dummy Qwen3-8B,
16K x 44 lanes, K = 128; 2026-12-06, 486130b), about 117 us a layer. Here that is one kernel.

Per row ``r = b * Hkv + h`` (request ``b``, KV head ``h``), from the acceptance ``n[b]`` and position ``pos[b]``:

- ``s = min(n + 1, k)``, the accepted query index; the run fills a block when ``(pos + n + 1) // bs > (pos + 1) //
  bs`` (``fills``), block ``b_new = (pos + 1) // bs``;
- the filled block's score for the row's KV head from query ``q[b, s]`` and the summaries ``a, b`` of block
  ``b_new`` of seat ``lanes[b]``: the same tensor-core dots and head combine as ``block_score`` /
  ``block_score_any`` on a one-block tile (so the same value a full rescoring gives), ``+inf`` where the scorer has
  ``+sink`` and ``b_new == 0``;
- ``P_true``: the candidate ``ids[s - 1, r]`` with block ``b_new`` inserted after every valid entry scored at least
  as high (``merge_block``; rows that fill nothing keep the candidate), or the given set (``given``, replayed or
  synthetic selections);
- the output ``repair_pred(P_true, p_hat[r], resident[rows[r]])``: ``P_true`` without the entries that are in
  ``p_hat`` and not resident, a stable partition (kept entries in order, then the negative ones), by chunked
  broadcast compares (``K x K`` and ``K x S``).

Layout: ``ids`` [k, R, K] int64 and ``vals`` [k, R, K] fp32 (the beside candidates, -1 / -inf padded), ``p_hat``
[R, K] int, ``resident`` [N, S] int (a layer's table), ``rows`` [R] int (store rows), ``n``, ``pos``, ``lanes`` [B]
int, ``q`` [B, k + 1, Hq, D] (the pass's queries), ``a``, ``b`` [n_seats, Hkv, Nmax, D] (a layer's summaries);
returns [R, K] int64, and ``P_true`` into ``p_true_out`` when given. The plain-torch reference beside it
(``spec_repair_ref``) is ``SpecPipeline.repair``'s torch path. q is bf16 / fp16 on CUDA (as ``block_score``:
tensor-core dots); fp32 only under the interpreter (CPU tests).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from oasis_core.block_scorers import get_scorer, split_sink

from . import interpreting
from ._util import check, next_pow2
from .block_scorers import summary_tile_score

_SUMMARY = {"minmax": 0, "mean": 1, "meanstd": 2}
_COMBINE = {"max": 0, "sum": 1, "lse": 2}
TILE_N = 16  # the one-block score's tile (tl.dot's minimum): block_score's tile for a one-block view


@triton.jit
def _in_pool(vals, POOL, n_pool, CHUNK: tl.constexpr):
    """Whether each of ``vals`` [BLOCK] occurs among the ``n_pool`` entries at ``POOL`` (chunks of ``CHUNK``)."""
    hits = tl.zeros(vals.shape, dtype=tl.int32)
    for j in range(0, n_pool, CHUNK):
        offs = j + tl.arange(0, CHUNK)
        pool = tl.load(POOL + offs, mask=offs < n_pool, other=-1).to(tl.int64)
        hits += tl.sum((vals[:, None] == pool[None, :]).to(tl.int32), axis=1)
    return hits > 0


@triton.jit
def spec_repair_kernel(
    IDS,
    VALS,
    PHAT,
    RES,
    ROWS,
    NACC,
    POS,
    LANES,
    Q,
    A,
    B_,
    GIVEN,
    OUT,
    PTRUE,
    KD,
    BS,
    Nmax,
    S,
    scale,
    stride_ik,
    stride_ir,
    stride_vk,
    stride_vr,
    stride_pr,
    stride_res,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_as,
    stride_ah,
    stride_an,
    stride_bs,
    stride_bh,
    stride_bn,
    stride_gr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_G: tl.constexpr,
    TILE: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNK_K: tl.constexpr,
    CHUNK_S: tl.constexpr,
    SUMMARY: tl.constexpr,
    COMBINE: tl.constexpr,
    SINK: tl.constexpr,
    HAS_GIVEN: tl.constexpr,
    WRITE_TRUE: tl.constexpr,
):
    r = tl.program_id(0)
    b = r // HKV
    h = r % HKV
    offs_k = tl.arange(0, BLOCK_K)
    in_k = offs_k < K
    if HAS_GIVEN:
        pt = tl.load(GIVEN + r.to(tl.int64) * stride_gr + offs_k, mask=in_k, other=-1).to(tl.int64)
    else:
        n = tl.load(NACC + b).to(tl.int64)
        p = tl.load(POS + b).to(tl.int64)
        s = tl.minimum(n + 1, KD)  # query_index
        b_new = (p + 1) // BS
        fill = (p + n + 1) // BS > b_new
        # -- the filled block's score: block_score(_any)'s dots and combine on a one-block tile ----------------
        seat = tl.load(LANES + b).to(tl.int64)
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, D)
        offs_n = tl.arange(0, TILE)
        g_ok = offs_g < G
        ok = (offs_n == 0) & fill & (b_new < Nmax)
        q = tl.load(
            Q + b.to(tl.int64) * stride_qb + s * stride_qs + (h * G + offs_g)[:, None] * stride_qh + offs_d[None, :],
            mask=g_ok[:, None],
            other=0.0,
        )
        a = tl.load(
            A + seat * stride_as + h * stride_ah + (b_new + offs_n)[:, None] * stride_an + offs_d[None, :],
            mask=ok[:, None],
            other=0.0,
        )
        b_ptrs = B_ + seat * stride_bs + h * stride_bh + (b_new + offs_n)[:, None] * stride_bn + offs_d[None, :]
        best = summary_tile_score(q, a, b_ptrs, ok, g_ok, scale, SUMMARY, COMBINE)
        new_val = tl.max(tl.where(offs_n == 0, best, float("-inf")), 0)
        if SINK:  # the context's block 0 (the view's block 0 is b_new: the rule applies only where it is block 0)
            new_val = tl.where(b_new == 0, float("inf"), new_val)
        # -- merge_block: the candidate of index s with b_new inserted after every entry scored at least as high --
        base_i = IDS + (s - 1) * stride_ik + r.to(tl.int64) * stride_ir
        base_v = VALS + (s - 1) * stride_vk + r.to(tl.int64) * stride_vr
        ids = tl.load(base_i + offs_k, mask=in_k, other=-1).to(tl.int64)
        vals = tl.load(base_v + offs_k, mask=in_k, other=float("-inf")).to(tl.float32)
        at = tl.sum(((ids >= 0) & (vals >= new_val)).to(tl.int32), axis=0)
        at = tl.where(fill, at, K)
        prev = tl.load(base_i + tl.maximum(offs_k - 1, 0), mask=in_k, other=-1).to(tl.int64)
        pt = tl.where(offs_k < at, ids, tl.where(offs_k == at, b_new, prev))
        pt = tl.where(in_k, pt, -1)
    if WRITE_TRUE:
        tl.store(PTRUE + r.to(tl.int64) * K + offs_k, pt, mask=in_k)
    # -- repair_pred: drop P_true's entries that are in p_hat and not resident; stable partition -------------------
    row = tl.load(ROWS + r).to(tl.int64)
    in_hat = _in_pool(pt, PHAT + r.to(tl.int64) * stride_pr, K, CHUNK_K)
    in_res = _in_pool(pt, RES + row * stride_res, S, CHUNK_S)
    out = tl.where((pt >= 0) & in_hat & ~in_res, -1, pt)
    kept = (out >= 0) & in_k
    neg = (out < 0) & in_k
    n_kept = tl.sum(kept.to(tl.int32), axis=0)
    at_out = tl.where(kept, tl.cumsum(kept.to(tl.int32), axis=0) - 1, n_kept + tl.cumsum(neg.to(tl.int32), axis=0) - 1)
    tl.store(OUT + r.to(tl.int64) * K + at_out, out, mask=in_k)


def spec_repair(
    ids,
    vals,
    p_hat,
    resident,
    rows,
    n,
    pos,
    lanes,
    q,
    a,
    b,
    block_size: int,
    scorer: str,
    given=None,
    p_true_out=None,
    out=None,
    scale=None,
    num_warps=4,
):
    """The repair prediction [R, K] int64 of every row in one launch (module docstring); no host sync."""
    R, K = p_hat.shape
    B = n.shape[0]
    Bq, nq, Hq, D = q.shape
    n_seats, Hkv, Nmax, _ = a.shape
    N, S = resident.shape
    dev = p_hat.device
    assert R == B * Hkv and Bq == B, f"rows: R={R} must be B={B} x Hkv={Hkv} (q: {tuple(q.shape)})"
    assert Hq % Hkv == 0 and D == next_pow2(D) and D >= 16, f"Hq={Hq}, Hkv={Hkv}, D={D}"
    dtypes = (torch.bfloat16, torch.float16) + ((torch.float32,) if interpreting() else ())
    check(q, "q", (B, nq, Hq, D), dtypes, dev)
    check(a, "a", (n_seats, Hkv, Nmax, D), q.dtype, dev)
    check(b, "b", (n_seats, Hkv, Nmax, D), q.dtype, dev)
    check(resident, "resident", (N, S), None, dev)
    check(rows, "rows", (R,), None, dev)
    for name, t in (("n", n), ("pos", pos), ("lanes", lanes)):
        check(t, name, (B,), None, dev)
    if given is not None:
        check(given, "given", (R, K), None, dev)
    else:
        check(ids, "ids", (nq - 1, R, K), torch.int64, dev)
        check(vals, "vals", (nq - 1, R, K), torch.float32, dev)
    base, sink = split_sink(scorer)
    info = get_scorer(base)
    if out is None:
        out = torch.empty((R, K), dtype=torch.int64, device=dev)
    check(out, "out", (R, K), torch.int64, dev)
    if p_true_out is not None:
        check(p_true_out, "p_true_out", (R, K), torch.int64, dev)
    if R == 0:
        return out
    g = given if given is not None else p_hat  # unused pointers when not read
    ids = ids if given is None else p_hat
    vals = vals if given is None else out
    spec_repair_kernel[(R,)](
        ids,
        vals,
        p_hat,
        resident,
        rows,
        n,
        pos,
        lanes,
        q,
        a,
        b,
        g,
        out,
        p_true_out if p_true_out is not None else out,
        nq - 1,
        block_size,
        Nmax,
        S,
        float(1.0 / math.sqrt(D) if scale is None else scale),
        ids.stride(0) if given is None else 0,
        ids.stride(1) if given is None else 0,
        vals.stride(0) if given is None else 0,
        vals.stride(1) if given is None else 0,
        p_hat.stride(0),
        resident.stride(0),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        a.stride(0),
        a.stride(1),
        a.stride(2),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        g.stride(0),
        HKV=Hkv,
        G=Hq // Hkv,
        D=D,
        BLOCK_G=max(16, next_pow2(Hq // Hkv)),
        TILE=TILE_N,
        K=K,
        BLOCK_K=next_pow2(K),
        CHUNK_K=min(64, next_pow2(K)),
        CHUNK_S=min(64, next_pow2(S)),
        SUMMARY=_SUMMARY[info.summary],
        COMBINE=_COMBINE[info.combine],
        SINK=sink,
        HAS_GIVEN=given is not None,
        WRITE_TRUE=p_true_out is not None,
        num_warps=num_warps,
    )
    return out


def spec_repair_ref(
    ids,
    vals,
    p_hat,
    resident,
    rows,
    n,
    pos,
    lanes,
    q,
    a,
    b,
    block_size: int,
    scorer: str,
    given=None,
    scale=None,
    score=None,
):
    """Plain-torch reference, and ``SpecPipeline.repair``'s path without the kernel: the one-block view scored by
    ``score(q, a, b, n_blocks, seat, scorer)`` (default ``block_score_ref`` / ``block_score_any_ref``; the executor
    passes ``oasis_exec.ops.block_score``), then ``oasis_core.spec_predict.merge_block`` and ``repair_pred``. Returns
    (out, P_true), [R, K] int64 each."""
    from oasis_core.spec_predict import fills, merge_block, query_index, repair_pred

    from .block_score import block_score_ref
    from .block_scorers import block_score_any_ref

    R = p_hat.shape[0]
    B, nq = q.shape[:2]
    H = R // B
    dev = q.device
    if given is not None:
        p_true = given.reshape(R, -1).long()
    else:
        k = nq - 1
        s_true = query_index(n, k)
        b_new = (pos.long() + 1) // block_size
        ar = torch.arange(B, device=dev)
        hh = torch.arange(H, device=dev)
        qt = q[ar, s_true].contiguous()
        one = (lanes.long()[:, None], hh[None, :], b_new[:, None])
        lo, hi = a[one][:, :, None].contiguous(), b[one][:, :, None].contiguous()
        two = torch.full((B,), 2, dtype=torch.int32, device=dev)
        base, sink = split_sink(scorer)
        if score is not None:
            sc = score(qt, lo, hi, two, ar.to(torch.int32), base)
        elif base == "minmax":
            sc = block_score_ref(qt, lo, hi, two, ar.to(torch.int32))
        else:
            sc = block_score_any_ref(qt, lo, hi, two, base, ar.to(torch.int32), scale=scale)
        new_val = sc.reshape(R, -1)[:, 0]
        b_new_r = b_new.repeat_interleave(H)
        if sink:
            new_val = torch.where(b_new_r == 0, torch.full_like(new_val, float("inf")), new_val)
        pick = ((s_true - 1).repeat_interleave(H), torch.arange(R, device=dev))
        p_true, _ = merge_block(ids[pick], vals[pick], b_new_r, new_val, fills(pos, n, block_size).repeat_interleave(H))
    return repair_pred(p_true, p_hat, resident[rows.long()]), p_true
