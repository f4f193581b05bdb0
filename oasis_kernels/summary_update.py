"""Min/max key summaries of blocks, written into the summary tensors (one program per item).

An *item* says: take the keys of source block ``src[i]`` (its first ``n_valid[i]`` tokens), reduce them to the
coordinate-wise min and max, and write those into summary row ``dst_row[i]`` at block ``dst_block[i]``.

Layout:

- ``k_src: [n_src, block_size, D]``: any tensor viewed as blocks of keys, last dim contiguous. Examples: the GPU
  slot pool ``k_slots`` (src = slot id, e.g. the local block's slot); keys of a prefill chunk
  ``[B, Hkv, T, D].view(B * Hkv * T // bs, bs, D)``; a host-pool layer ``[n_blocks, Hkv, bs, D].view(-1, bs, D)``
  (src = block * Hkv + head);
- ``kmin, kmax: [n_rows, Nmax, D]``: the summaries viewed by row, e.g. ``[n_seats, Hkv, Nmax, D].view(-1, Nmax, D)``
  (row = seat * Hkv + head);
- ``src, dst_row, dst_block, n_valid: [M]`` int32; an item with ``src < 0`` or ``n_valid <= 0`` is skipped.

The summary is overwritten (not folded): with ``n_valid`` counting every token written so far, re-summarising the
local block each step gives the exact summary of its valid tokens, the same as ``oasis_core.scoring``'s fold.
``summary_update_local`` builds the items for "the local block of every (request, head)" without a host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._util import HBM_ROOFLINE_GBPS, check, next_pow2
from .prologue import summary_item


@triton.jit
def summary_update_kernel(
    K,
    SRC,
    DROW,
    DBLK,
    NVALID,
    KMIN,
    KMAX,
    stride_ks,
    stride_kt,
    stride_mr,
    stride_mn,
    stride_xr,
    stride_xn,
    BS: tl.constexpr,
    D: tl.constexpr,
):
    row, blk, n_valid, live, ok, k = summary_item(K, SRC, DROW, DBLK, NVALID, stride_ks, stride_kt, BS, D)
    offs_d = tl.arange(0, D)
    lo = tl.min(tl.where(ok[:, None], k, float("inf")), 0)
    hi = tl.max(tl.where(ok[:, None], k, float("-inf")), 0)
    d_ok = live & (offs_d < D)
    r64 = tl.where(live, row, 0).to(tl.int64)
    b64 = tl.where(live, blk, 0).to(tl.int64)
    tl.store(KMIN + r64 * stride_mr + b64 * stride_mn + offs_d, lo.to(KMIN.dtype.element_ty), mask=d_ok)
    tl.store(KMAX + r64 * stride_xr + b64 * stride_xn + offs_d, hi.to(KMAX.dtype.element_ty), mask=d_ok)


def summary_update(k_src, src, dst_row, dst_block, n_valid, kmin, kmax):
    """Write the min/max summary of each item's source block; see the module docstring for layouts."""
    n_src, BS, D = k_src.shape
    n_rows, Nmax, _ = kmin.shape
    M = src.shape[0]
    dev = k_src.device
    assert D == next_pow2(D) and BS == next_pow2(BS), f"D={D} and block_size={BS} must be powers of 2"
    check(k_src, "k_src", (n_src, BS, D), None, dev)
    check(kmin, "kmin", (n_rows, Nmax, D), None, dev)
    check(kmax, "kmax", (n_rows, Nmax, D), kmin.dtype, dev)
    for name, t in (("src", src), ("dst_row", dst_row), ("dst_block", dst_block), ("n_valid", n_valid)):
        check(t, name, (M,), torch.int32, dev)
    if M == 0:
        return
    summary_update_kernel[(M,)](
        k_src,
        src,
        dst_row,
        dst_block,
        n_valid,
        kmin,
        kmax,
        k_src.stride(0),
        k_src.stride(1),
        kmin.stride(0),
        kmin.stride(1),
        kmax.stride(0),
        kmax.stride(1),
        BS=BS,
        D=D,
        num_warps=2,
    )


def local_items(local_slot, local_len, n_blocks, seat=None):
    """Items that re-summarise the local block of every (request b, KV head h), as int32 tensors (no sync).

    local_slot: [B, Hkv] int32 slot of the local block (-1 none); local_len: [B] int32 valid tokens;
    n_blocks: [B] int32 (the local block is ``n_blocks - 1``); seat: [B] int32 summary seat (default b).
    Returns ``(src, dst_row, dst_block, n_valid)``, each [B * Hkv], with row = seat * Hkv + h.
    """
    B, Hkv = local_slot.shape
    seat = torch.arange(B, device=local_slot.device, dtype=torch.int32) if seat is None else seat
    heads = torch.arange(Hkv, device=local_slot.device, dtype=torch.int32)
    src = local_slot.reshape(-1).to(torch.int32)
    dst_row = (seat[:, None] * Hkv + heads[None, :]).reshape(-1).to(torch.int32)
    dst_block = (n_blocks - 1)[:, None].expand(B, Hkv).reshape(-1).to(torch.int32)
    nv = local_len[:, None].expand(B, Hkv).reshape(-1).to(torch.int32)
    return src, dst_row, dst_block, nv


def summary_update_local(k_slots, local_slot, local_len, n_blocks, kmin, kmax, seat=None):
    """Re-summarise every request's local block from the slot pool. kmin/kmax: [n_seats, Hkv, Nmax, D]."""
    n_seats, Hkv, Nmax, D = kmin.shape
    assert kmin.is_contiguous() and kmax.is_contiguous(), "kmin/kmax must be contiguous to be viewed by row"
    summary_update(
        k_slots,
        *local_items(local_slot, local_len, n_blocks, seat),
        kmin.view(n_seats * Hkv, Nmax, D),
        kmax.view(n_seats * Hkv, Nmax, D),
    )


def summary_update_ref(k_src, src, dst_row, dst_block, n_valid, kmin, kmax):
    """Plain-torch reference, in place (a Python loop over items: test sizes only)."""
    for i in range(src.shape[0]):
        s, nv = int(src[i]), int(n_valid[i])
        if s < 0 or nv <= 0:
            continue
        keys = k_src[s, :nv].float()
        kmin[int(dst_row[i]), int(dst_block[i])] = keys.amin(0).to(kmin.dtype)
        kmax[int(dst_row[i]), int(dst_block[i])] = keys.amax(0).to(kmax.dtype)


def bench_summary_update(batch=64, n_kv_heads=8, head_dim=128, block_size=16, n_max=1024, seed=0):
    """GB/s of keys read + summaries written for one full-block summary per (request, head)."""
    from triton.testing import do_bench

    torch.manual_seed(seed)
    dev = torch.device("cuda")
    rows = batch * n_kv_heads
    k_slots = torch.randn(rows * 2, block_size, head_dim, device=dev, dtype=torch.bfloat16)
    kmin = torch.zeros(rows, n_max, head_dim, device=dev, dtype=torch.bfloat16)
    kmax = torch.zeros_like(kmin)
    src = torch.randperm(rows * 2, device=dev)[:rows].to(torch.int32)
    drow = torch.arange(rows, device=dev, dtype=torch.int32)
    dblk = torch.randint(0, n_max, (rows,), device=dev, dtype=torch.int32)
    nv = torch.full((rows,), block_size, device=dev, dtype=torch.int32)
    fn = lambda: summary_update(k_slots, src, drow, dblk, nv, kmin, kmax)
    ms = do_bench(fn, warmup=25, rep=200)
    nbytes = rows * (block_size + 2) * head_dim * 2
    gbps = nbytes / ms / 1e6
    return dict(
        kernel="summary_update",
        batch=batch,
        ms=ms,
        bytes=nbytes,
        gbps=gbps,
        roofline_gbps=HBM_ROOFLINE_GBPS,
        frac_roofline=gbps / HBM_ROOFLINE_GBPS,
        note="latency-bound at this size: what matters is the absolute time per layer",
    )
