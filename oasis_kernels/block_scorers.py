"""The alternative block scorers (``oasis_core.block_scorers``): their scores and their summaries, on the GPU.

``block_score_any(q, a, b, n_blocks, scorer, seat=None, exclude_local=True, scale=None)`` scores every block of every
KV head with the same layout as ``block_score`` (``a, b`` in place of ``kmin, kmax``: ``[n_seats, Hkv, Nmax, D]``,
``q: [B, Hq, D]``, ``n_blocks`` int32 [B], ``seat`` int32 [B]; fp32 ``[B, Hkv, Nmax]``, ``-inf`` past the eligible
blocks) for any scorer: the summary kind picks the per-head score (``minmax``: the bound; ``mean``: ``q . a``;
``meanstd``: ``c q . a + c^2 / 2 (q * q) . (b * b)``, ``c`` the softmax scale), the combine how a KV head pools its
query heads (max, sum, log-sum-exp), ``+sink`` sets block 0 to ``+inf`` (when eligible). Tensor-core dots on each
summary tile, read once per group, as ``block_score``.

``summary_moments(k_src, src, dst_row, dst_block, n_valid, a, b, with_std)`` writes the mean key (``a``; ``b``: the
per-channel population standard deviation with ``with_std``, else the mean again) of each item's source block, with
``summary_update``'s item layout (the minmax scorers keep using ``summary_update``).
``summary_update_any`` dispatches by scorer. Each kernel has its plain-torch reference beside it.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from oasis_core.block_scorers import get_scorer

from ._util import HBM_ROOFLINE_GBPS, cdiv, check, next_pow2
from .prologue import score_program, summary_item
from .summary_update import summary_update

_SUMMARY = {"minmax": 0, "mean": 1, "meanstd": 2}
_COMBINE = {"max": 0, "sum": 1, "lse": 2}


@triton.jit
def summary_tile_score(q, a, b_ptrs, ok, g_ok, scale, SUMMARY: tl.constexpr, COMBINE: tl.constexpr):
    """One KV head's scores of a tile of blocks from their summaries (``block_score_any_kernel``, and the filled
    block of ``spec_repair``): ``q`` [BLOCK_G, D] the group's query heads (``g_ok`` the real ones), ``a`` [N, D] the
    first summary, loaded; ``b_ptrs`` the second's pointers (read where ``ok`` unless ``SUMMARY`` is ``mean``) ->
    [N] fp32, before the sink rule and the eligibility mask."""
    if SUMMARY == 1:
        s = tl.dot(q.to(a.dtype), tl.trans(a))  # [G, N]
    else:
        bb = tl.load(b_ptrs, mask=ok[:, None], other=0.0)
        if SUMMARY == 0:
            zero = tl.zeros_like(q)
            s = tl.dot(tl.where(q > 0, q, zero).to(bb.dtype), tl.trans(bb)) + tl.dot(
                tl.where(q < 0, q, zero).to(a.dtype), tl.trans(a)
            )
        else:
            qf = q.to(tl.float32)
            bf = bb.to(tl.float32)
            s = scale * tl.dot(q.to(a.dtype), tl.trans(a)) + (0.5 * scale * scale) * tl.dot(
                (qf * qf).to(a.dtype), tl.trans((bf * bf).to(a.dtype))
            )
    if COMBINE == 0:
        best = tl.max(tl.where(g_ok[:, None], s, float("-inf")), 0)
    elif COMBINE == 1:
        best = tl.sum(tl.where(g_ok[:, None], s, 0.0), 0)
    else:
        s = tl.where(g_ok[:, None], s, float("-inf"))
        m = tl.max(s, 0)
        best = m + tl.log(tl.sum(tl.exp(s - m[None, :]), 0))
    return best


@triton.jit
def block_score_any_kernel(
    Q,
    A,
    B_,
    SEAT,
    NBLK,
    OUT,
    Nmax,
    scale,
    stride_qb,
    stride_qh,
    stride_as,
    stride_ah,
    stride_an,
    stride_bs,
    stride_bh,
    stride_bn,
    stride_ob,
    stride_oh,
    HKV: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SEAT: tl.constexpr,
    EXCLUDE_LOCAL: tl.constexpr,
    SUMMARY: tl.constexpr,
    COMBINE: tl.constexpr,
    SINK: tl.constexpr,
):
    nb, b, h, seat, n_ok_blk = score_program(SEAT, NBLK, HKV, HAS_SEAT, EXCLUDE_LOCAL)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs_n < n_ok_blk
    g_ok = offs_g < G
    q = tl.load(
        Q + b.to(tl.int64) * stride_qb + (h * G + offs_g)[:, None] * stride_qh + offs_d[None, :],
        mask=g_ok[:, None],
        other=0.0,
    )
    a = tl.load(
        A + seat.to(tl.int64) * stride_as + h * stride_ah + offs_n[:, None] * stride_an + offs_d[None, :],
        mask=ok[:, None],
        other=0.0,
    )
    b_ptrs = B_ + seat.to(tl.int64) * stride_bs + h * stride_bh + offs_n[:, None] * stride_bn + offs_d[None, :]
    best = summary_tile_score(q, a, b_ptrs, ok, g_ok, scale, SUMMARY, COMBINE)
    if SINK:
        best = tl.where(offs_n == 0, float("inf"), best)
    best = tl.where(ok, best, float("-inf"))
    tl.store(OUT + b.to(tl.int64) * stride_ob + h * stride_oh + offs_n, best, mask=offs_n < Nmax)


def block_score_any(
    q, a, b, n_blocks, scorer: str, seat=None, exclude_local=True, scale=None, out=None, block_n=64, num_warps=4
):
    """Scores ``[B, Hkv, Nmax]`` fp32 of every block by ``scorer``; see the module docstring."""
    info = get_scorer(scorer)
    B, Hq, D = q.shape
    n_seats, Hkv, Nmax, _ = a.shape
    dev = q.device
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    assert D == next_pow2(D) and D >= 16, f"head dim {D} must be a power of 2 >= 16"
    check(q, "q", (B, Hq, D), (torch.bfloat16, torch.float16), dev)
    check(a, "a", (n_seats, Hkv, Nmax, D), q.dtype, dev)
    check(b, "b", (n_seats, Hkv, Nmax, D), q.dtype, dev)
    check(n_blocks, "n_blocks", (B,), torch.int32, dev)
    if seat is not None:
        check(seat, "seat", (B,), torch.int32, dev)
    else:
        assert n_seats >= B, f"without seat, a needs >= B={B} seats, has {n_seats}"
    if out is None:
        out = torch.empty((B, Hkv, Nmax), dtype=torch.float32, device=dev)
    check(out, "out", (B, Hkv, Nmax), torch.float32, dev)
    block_n = max(16, min(block_n, next_pow2(Nmax)))
    grid = (B * Hkv, cdiv(Nmax, block_n))
    block_score_any_kernel[grid](
        q,
        a,
        b,
        seat if seat is not None else n_blocks,
        n_blocks,
        out,
        Nmax,
        float(1.0 / math.sqrt(D) if scale is None else scale),
        q.stride(0),
        q.stride(1),
        a.stride(0),
        a.stride(1),
        a.stride(2),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        out.stride(0),
        out.stride(1),
        HKV=Hkv,
        G=Hq // Hkv,
        D=D,
        BLOCK_G=max(16, next_pow2(Hq // Hkv)),
        BLOCK_N=block_n,
        HAS_SEAT=seat is not None,
        EXCLUDE_LOCAL=exclude_local,
        SUMMARY=_SUMMARY[info.summary],
        COMBINE=_COMBINE[info.combine],
        SINK=info.sink,
        num_warps=num_warps,
    )
    return out


def block_score_any_ref(q, a, b, n_blocks, scorer: str, seat=None, exclude_local=True, scale=None):
    """Plain-torch reference in fp32: each scorer's formula term by term, then the masking."""
    info = get_scorer(scorer)
    B, Hq, D = q.shape
    Hkv, Nmax = a.shape[1], a.shape[2]
    c = 1.0 / math.sqrt(D) if scale is None else scale
    idx = seat.long() if seat is not None else torch.arange(B, device=q.device)
    qg = q.float().reshape(B, Hkv, Hq // Hkv, 1, D)
    av, bv = a[idx].float()[:, :, None], b[idx].float()[:, :, None]  # [B, Hkv, 1, Nmax, D]
    if info.summary == "minmax":
        s = torch.maximum(qg * bv, qg * av).sum(-1)  # [B, Hkv, G, Nmax]
    elif info.summary == "mean":
        s = (qg * av).sum(-1)
    else:
        s = c * (qg * av).sum(-1) + 0.5 * c * c * (qg * qg * bv * bv).sum(-1)
    s = {"max": lambda x: x.amax(2), "sum": lambda x: x.sum(2), "lse": lambda x: torch.logsumexp(x, 2)}[info.combine](s)
    if info.sink:
        s[..., 0] = float("inf")
    limit = n_blocks.long() - (1 if exclude_local else 0)
    ok = torch.arange(Nmax, device=q.device)[None, :] < limit[:, None]
    return torch.where(ok[:, None, :], s, torch.full_like(s, float("-inf")))


@triton.jit
def summary_moments_kernel(
    K,
    SRC,
    DROW,
    DBLK,
    NVALID,
    A,
    B_,
    stride_ks,
    stride_kt,
    stride_ar,
    stride_an,
    stride_br,
    stride_bn,
    BS: tl.constexpr,
    D: tl.constexpr,
    WITH_STD: tl.constexpr,
):
    row, blk, n_valid, live, ok, k = summary_item(K, SRC, DROW, DBLK, NVALID, stride_ks, stride_kt, BS, D)
    offs_d = tl.arange(0, D)
    cnt = tl.maximum(n_valid, 1).to(tl.float32)
    mean = tl.sum(k, 0) / cnt
    if WITH_STD:
        dev = tl.where(ok[:, None], k - mean[None, :], 0.0)
        second = tl.sqrt(tl.sum(dev * dev, 0) / cnt)
    else:
        second = mean
    d_ok = live & (offs_d < D)
    r64 = tl.where(live, row, 0).to(tl.int64)
    b64 = tl.where(live, blk, 0).to(tl.int64)
    tl.store(A + r64 * stride_ar + b64 * stride_an + offs_d, mean.to(A.dtype.element_ty), mask=d_ok)
    tl.store(B_ + r64 * stride_br + b64 * stride_bn + offs_d, second.to(B_.dtype.element_ty), mask=d_ok)


def summary_moments(k_src, src, dst_row, dst_block, n_valid, a, b, with_std: bool):
    """Write each item's block mean (and standard deviation) into ``a`` (``b``); layouts as ``summary_update``."""
    n_src, BS, D = k_src.shape
    n_rows, Nmax, _ = a.shape
    M = src.shape[0]
    dev = k_src.device
    assert D == next_pow2(D) and BS == next_pow2(BS), f"D={D} and block_size={BS} must be powers of 2"
    check(k_src, "k_src", (n_src, BS, D), None, dev)
    check(a, "a", (n_rows, Nmax, D), None, dev)
    check(b, "b", (n_rows, Nmax, D), a.dtype, dev)
    for name, t in (("src", src), ("dst_row", dst_row), ("dst_block", dst_block), ("n_valid", n_valid)):
        check(t, name, (M,), torch.int32, dev)
    if M == 0:
        return
    summary_moments_kernel[(M,)](
        k_src,
        src,
        dst_row,
        dst_block,
        n_valid,
        a,
        b,
        k_src.stride(0),
        k_src.stride(1),
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        BS=BS,
        D=D,
        WITH_STD=with_std,
        num_warps=2,
    )


def summary_moments_ref(k_src, src, dst_row, dst_block, n_valid, a, b, with_std: bool):
    """Plain-torch reference, in place (a Python loop over items: test sizes only)."""
    for i in range(src.shape[0]):
        s, nv = int(src[i]), int(n_valid[i])
        if s < 0 or nv <= 0:
            continue
        keys = k_src[s, :nv].float()
        mean = keys.mean(0)
        a[int(dst_row[i]), int(dst_block[i])] = mean.to(a.dtype)
        second = (keys - mean).pow(2).mean(0).sqrt() if with_std else mean
        b[int(dst_row[i]), int(dst_block[i])] = second.to(b.dtype)


def summary_update_any(k_src, src, dst_row, dst_block, n_valid, a, b, scorer: str):
    """The summaries ``scorer`` reads: min/max (``summary_update``) or the moments (``summary_moments``)."""
    kind = get_scorer(scorer).summary
    if kind == "minmax":
        return summary_update(k_src, src, dst_row, dst_block, n_valid, a, b)
    return summary_moments(k_src, src, dst_row, dst_block, n_valid, a, b, kind == "meanstd")


def bench_block_score_any(
    scorer="minmax", batch=64, n_q_heads=32, n_kv_heads=8, head_dim=128, context=16384, block_size=16, seed=0
):
    """Time and GB/s over the summary bytes each scorer reads, against the 4.3 TB/s roofline."""
    from triton.testing import do_bench

    torch.manual_seed(seed)
    dev = torch.device("cuda")
    n = context // block_size
    a = torch.randn(batch, n_kv_heads, n, head_dim, device=dev, dtype=torch.bfloat16)
    b = a + torch.rand_like(a)
    q = torch.randn(batch, n_q_heads, head_dim, device=dev, dtype=torch.bfloat16)
    nb = torch.full((batch,), n, dtype=torch.int32, device=dev)
    out = torch.empty(batch, n_kv_heads, n, device=dev)
    fn = lambda: block_score_any(q, a, b, nb, scorer, out=out)
    fn()
    ref = block_score_any_ref(q[:2], a[:2], b[:2], nb[:2], scorer)
    fin = torch.isfinite(ref)
    err = ((out[:2] - ref).abs()[fin].max() / ref[fin].abs().max()).item()
    ms = do_bench(fn, warmup=25, rep=200)
    nbytes = get_scorer(scorer).vectors_read * a.numel() * 2
    gbps = nbytes / ms / 1e6
    return dict(
        kernel="block_score_any",
        scorer=scorer,
        batch=batch,
        context=context,
        ms=ms,
        bytes=nbytes,
        gbps=gbps,
        roofline_gbps=HBM_ROOFLINE_GBPS,
        frac_roofline=gbps / HBM_ROOFLINE_GBPS,
        max_rel_err=err,
    )
