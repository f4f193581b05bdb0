"""Quest upper-bound scores of every block of every KV head against the min/max key summaries.

For a query q and a block summarised by ``kmin, kmax`` (coordinate-wise over its keys), the score is
``sum_i max(q_i * kmax_i, q_i * kmin_i) = relu(q) . kmax + min(q, 0) . kmin`` (``oasis_core.scoring``); with GQA
the score of a KV head is the maximum over its ``G`` query heads (query head ``h * G + g`` reads KV head ``h``).

Layout:

- ``q: [B, Hq, D]`` bf16/fp16 (the draft query of each request), last dim contiguous;
- ``kmin, kmax: [n_seats, Hkv, Nmax, D]`` bf16/fp16, the summaries of one layer, last dim contiguous; request b
  reads seat ``seat[b]`` (int32 [B], optional; default seat = b);
- ``n_blocks: [B]`` int32, blocks of each request's context including the partial local block.

Returns ``scores: [B, Hkv, Nmax]`` fp32; ``-inf`` for blocks ``>= n_blocks[b]`` and, with ``exclude_local``
(default), for the local block ``n_blocks[b] - 1`` as well, so ``torch.topk`` never picks them (entries of rows
with fewer eligible blocks than K come out as -inf: check the values, or use ``oasis_core.scoring.topk_blocks``).
Both products are formed by tensor-core dots on the query's halves; each summary tile is read once per group.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._util import HBM_ROOFLINE_GBPS, cdiv, check, next_pow2
from .prologue import score_program


@triton.jit
def block_score_kernel(
    Q,
    KMIN,
    KMAX,
    SEAT,
    NBLK,
    OUT,
    Nmax,
    stride_qb,
    stride_qh,
    stride_ms,
    stride_mh,
    stride_mn,
    stride_xs,
    stride_xh,
    stride_xn,
    stride_ob,
    stride_oh,
    HKV: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SEAT: tl.constexpr,
    EXCLUDE_LOCAL: tl.constexpr,
):
    nb, b, h, seat, n_ok_blk = score_program(SEAT, NBLK, HKV, HAS_SEAT, EXCLUDE_LOCAL)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs_n < n_ok_blk
    q = tl.load(
        Q + b.to(tl.int64) * stride_qb + (h * G + offs_g)[:, None] * stride_qh + offs_d[None, :],
        mask=(offs_g < G)[:, None],
        other=0.0,
    )
    zero = tl.zeros_like(q)
    q_pos = tl.where(q > 0, q, zero)
    q_neg = tl.where(q < 0, q, zero)
    kmin = tl.load(
        KMIN + seat.to(tl.int64) * stride_ms + h * stride_mh + offs_n[:, None] * stride_mn + offs_d[None, :],
        mask=ok[:, None],
        other=0.0,
    )
    kmax = tl.load(
        KMAX + seat.to(tl.int64) * stride_xs + h * stride_xh + offs_n[:, None] * stride_xn + offs_d[None, :],
        mask=ok[:, None],
        other=0.0,
    )
    s = tl.dot(q_pos.to(kmax.dtype), tl.trans(kmax)) + tl.dot(q_neg.to(kmin.dtype), tl.trans(kmin))  # [G, N]
    s = tl.where((offs_g < G)[:, None], s, float("-inf"))
    best = tl.max(s, 0)
    best = tl.where(ok, best, float("-inf"))
    tl.store(OUT + b.to(tl.int64) * stride_ob + h * stride_oh + offs_n, best, mask=offs_n < Nmax)


def block_score(q, kmin, kmax, n_blocks, seat=None, exclude_local=True, out=None, block_n=64, num_warps=4):
    """Scores ``[B, Hkv, Nmax]`` fp32 of every block; see the module docstring for layouts and masking."""
    B, Hq, D = q.shape
    n_seats, Hkv, Nmax, _ = kmin.shape
    dev = q.device
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    assert D == next_pow2(D) and D >= 16, f"head dim {D} must be a power of 2 >= 16"
    check(q, "q", (B, Hq, D), (torch.bfloat16, torch.float16), dev)
    check(kmin, "kmin", (n_seats, Hkv, Nmax, D), q.dtype, dev)
    check(kmax, "kmax", (n_seats, Hkv, Nmax, D), q.dtype, dev)
    check(n_blocks, "n_blocks", (B,), torch.int32, dev)
    if seat is not None:
        check(seat, "seat", (B,), torch.int32, dev)
    else:
        assert n_seats >= B, f"without seat, kmin needs >= B={B} seats, has {n_seats}"
    if out is None:
        out = torch.empty((B, Hkv, Nmax), dtype=torch.float32, device=dev)
    check(out, "out", (B, Hkv, Nmax), torch.float32, dev)
    block_n = max(16, min(block_n, next_pow2(Nmax)))
    grid = (B * Hkv, cdiv(Nmax, block_n))
    block_score_kernel[grid](
        q,
        kmin,
        kmax,
        seat if seat is not None else n_blocks,
        n_blocks,
        out,
        Nmax,
        q.stride(0),
        q.stride(1),
        kmin.stride(0),
        kmin.stride(1),
        kmin.stride(2),
        kmax.stride(0),
        kmax.stride(1),
        kmax.stride(2),
        out.stride(0),
        out.stride(1),
        HKV=Hkv,
        G=Hq // Hkv,
        D=D,
        BLOCK_G=max(16, next_pow2(Hq // Hkv)),
        BLOCK_N=block_n,
        HAS_SEAT=seat is not None,
        EXCLUDE_LOCAL=exclude_local,
        num_warps=num_warps,
    )
    return out


def block_score_ref(q, kmin, kmax, n_blocks, seat=None, exclude_local=True):
    """Plain-torch reference in fp32 (the formula of ``oasis_core.scoring.score_blocks``, plus the masking)."""
    B, Hq, D = q.shape
    Hkv, Nmax = kmin.shape[1], kmin.shape[2]
    idx = seat.long() if seat is not None else torch.arange(B, device=q.device)
    qg = q.float().reshape(B, Hkv, Hq // Hkv, 1, D)
    lo, hi = kmin[idx].float()[:, :, None], kmax[idx].float()[:, :, None]  # [B, Hkv, 1, Nmax, D]
    s = torch.maximum(qg * hi, qg * lo).sum(-1).amax(2)  # [B, Hkv, Nmax]
    limit = n_blocks.long() - (1 if exclude_local else 0)
    ok = torch.arange(Nmax, device=q.device)[None, :] < limit[:, None]
    return torch.where(ok[:, None, :], s, torch.full_like(s, float("-inf")))


def bench_block_score(
    batch=64, n_q_heads=32, n_kv_heads=8, head_dim=128, context=16384, block_size=16, block_n=64, num_warps=4, seed=0
):
    """GB/s over the summary bytes read (kmin + kmax of every block), against the 4.3 TB/s roofline."""
    from triton.testing import do_bench

    torch.manual_seed(seed)
    dev = torch.device("cuda")
    n = context // block_size
    kmin = torch.randn(batch, n_kv_heads, n, head_dim, device=dev, dtype=torch.bfloat16)
    kmax = kmin + torch.rand_like(kmin)
    q = torch.randn(batch, n_q_heads, head_dim, device=dev, dtype=torch.bfloat16)
    nb = torch.full((batch,), n, dtype=torch.int32, device=dev)
    out = torch.empty(batch, n_kv_heads, n, device=dev)
    fn = lambda: block_score(q, kmin, kmax, nb, out=out, block_n=block_n, num_warps=num_warps)
    fn()
    ref = block_score_ref(q[:2], kmin[:2], kmax[:2], nb[:2])
    fin = torch.isfinite(ref)
    err = ((out[:2] - ref).abs()[fin].max() / ref[fin].abs().max()).item()
    ms = do_bench(fn, warmup=25, rep=200)
    nbytes = 2 * kmin.numel() * 2
    gbps = nbytes / ms / 1e6
    return dict(
        kernel="block_score",
        batch=batch,
        context=context,
        block_n=block_n,
        num_warps=num_warps,
        ms=ms,
        bytes=nbytes,
        gbps=gbps,
        roofline_gbps=HBM_ROOFLINE_GBPS,
        frac_roofline=gbps / HBM_ROOFLINE_GBPS,
        max_rel_err=err,
    )
