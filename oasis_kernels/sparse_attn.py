"""Sparse decode attention over resident KV slots through the per-head slot table (normal + draft query, GQA).

Layout (one call per layer):

- ``k_slots, v_slots: [n_slots, block_size, D]`` bf16, the GPU slot pool of the layer: one slot holds one
  (block, KV head). Only the last dim must be contiguous.
- ``slot_ids: [B, Hkv, S]`` int32: per row (request b, KV head h) the slots of its resident *full* blocks
  (the top-K), any order, ``-1`` = unused entry (anywhere in the row). Every listed slot has ``block_size`` valid
  tokens.
- ``local_slot: [B, Hkv]`` int32 (optional): the slot holding row's local (newest, partial) block, ``-1`` = none;
  ``local_len: [B]`` int32: its valid token count, 0..block_size, the same for every head of a request. The normal
  token's own KV must already be written into the local block (so ``local_len`` counts it).
- ``q: [B, Hq, Tq, D]`` bf16, ``Hq = G * Hkv`` (query head ``h * G + g`` reads KV head ``h``). Query t = 0 is the
  normal token; t >= 1 are draft tokens.
- ``extra_k, extra_v: [B, Hkv, Tq - 1, D]`` bf16 (optional): KV of the draft positions, which are *not* in the local
  block. Query t attends extra entries ``e < t`` only: the draft query (t = 1) sees the resident set, the local block
  and the extra token 0 (its own KV); the normal query never sees an extra entry.

Every query of row (b, h) attends the same resident set, so each KV tile is loaded once for all ``G * Tq`` queries
of the group. Split-K: program (row, split) covers a contiguous range of the ``S + 1`` entries (the local block is
entry S); with one split the program writes the output directly, else ``splitk.merge`` combines the partials.

Returns ``out [B, Hq, Tq, D]`` (dtype of q) and, if asked, ``lse [B, Hq, Tq]`` fp32 (natural log of the sum of
exp(scaled logits)); a query with no valid key gets out = 0 and lse = -inf.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._util import HBM_ROOFLINE_GBPS, cdiv, check, default_n_split, next_pow2
from .splitk import merge, online_softmax_step, store_partial_or_final


@triton.jit
def sparse_attn_kernel(
    Q,
    K,
    V,
    SLOT,
    LOCAL_SLOT,
    LOCAL_LEN,
    EK,
    EV,
    O_PART,
    LSE_PART,
    OUT,
    LSE_OUT,
    qk_scale,
    S,
    n_per_split,
    n_split,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_ks,
    stride_kt,
    stride_vs,
    stride_vt,
    stride_sb,
    stride_sh,
    stride_lsb,
    stride_lsh,
    stride_ekb,
    stride_ekh,
    stride_ekt,
    stride_evb,
    stride_evh,
    stride_evt,
    stride_ob,
    stride_oh,
    stride_ot,
    stride_lb,
    stride_lh,
    stride_lt,
    HKV: tl.constexpr,
    G: tl.constexpr,
    TQ: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    BPI: tl.constexpr,
    BLOCK_M: tl.constexpr,
    NE_PAD: tl.constexpr,
    HAS_LOCAL: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    DIRECT: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    g = offs_m // TQ
    t = offs_m % TQ
    m_ok = offs_m < G * TQ
    q = tl.load(
        Q + b.to(tl.int64) * stride_qb + (h * G + g)[:, None] * stride_qh + t[:, None] * stride_qt + offs_d[None, :],
        mask=m_ok[:, None],
        other=0.0,
    )  # [BLOCK_M, D]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    offs_n = tl.arange(0, BPI * BS)
    ent_in = offs_n // BS  # which entry of the tile a token belongs to
    tok = offs_n % BS
    slot_row = SLOT + b.to(tl.int64) * stride_sb + h * stride_sh
    n_ent = S
    if HAS_LOCAL:
        n_ent = S + 1
        lslot = tl.load(LOCAL_SLOT + b * stride_lsb + h * stride_lsh)
        llen = tl.load(LOCAL_LEN + b)
    start = split * n_per_split
    end = tl.minimum(start + n_per_split, n_ent)
    # Slot ids of iteration i + 1 are loaded in iteration i, so the K/V loads do not depend on a load of their own
    # iteration and the software pipeliner keeps num_stages - 1 tiles in flight.
    s_end = tl.minimum(end, S)
    slot_next = tl.load(slot_row + start + ent_in, mask=start + ent_in < s_end, other=-1)
    for e0 in range(0, n_per_split, BPI):
        e = start + e0 + ent_in
        slot = slot_next
        slot_next = tl.load(slot_row + e + BPI, mask=e + BPI < s_end, other=-1)
        n_valid = BS
        if HAS_LOCAL:
            is_local = e == S
            slot = tl.where(is_local, lslot, slot)
            n_valid = tl.where(is_local, llen, BS)
        valid = (slot >= 0) & (tok < n_valid) & (e < end)
        slot64 = tl.where(valid, slot, 0).to(tl.int64)
        k = tl.load(
            K + slot64[:, None] * stride_ks + tok[:, None] * stride_kt + offs_d[None, :], mask=valid[:, None], other=0.0
        )
        v = tl.load(
            V + slot64[:, None] * stride_vs + tok[:, None] * stride_vt + offs_d[None, :], mask=valid[:, None], other=0.0
        )
        m_i, l_i, acc = online_softmax_step(q, k, v, valid[None, :], m_i, l_i, acc, qk_scale)

    if HAS_EXTRA:
        # Draft positions' own KV: entry x is visible to query t iff x < t; done once, by the last split.
        offs_x = tl.arange(0, NE_PAD)
        x_ok = (offs_x < TQ - 1) & (split == n_split - 1)
        ek = tl.load(
            EK + b.to(tl.int64) * stride_ekb + h * stride_ekh + offs_x[:, None] * stride_ekt + offs_d[None, :],
            mask=x_ok[:, None],
            other=0.0,
        )
        ev = tl.load(
            EV + b.to(tl.int64) * stride_evb + h * stride_evh + offs_x[:, None] * stride_evt + offs_d[None, :],
            mask=x_ok[:, None],
            other=0.0,
        )
        vis = x_ok[None, :] & (offs_x[None, :] < t[:, None])
        m_i, l_i, acc = online_softmax_step(q, ek, ev, vis, m_i, l_i, acc, qk_scale)

    store_partial_or_final(
        acc,
        m_i,
        l_i,
        row,
        split,
        n_split,
        O_PART,
        LSE_PART,
        OUT,
        LSE_OUT,
        stride_ob,
        stride_oh,
        stride_ot,
        stride_lb,
        stride_lh,
        stride_lt,
        HKV,
        G,
        TQ,
        D,
        BLOCK_M,
        DIRECT,
        WRITE_LSE,
    )


def sparse_attn(
    q,
    k_slots,
    v_slots,
    slot_ids,
    local_slot=None,
    local_len=None,
    extra_k=None,
    extra_v=None,
    sm_scale=None,
    return_lse=False,
    out=None,
    lse=None,
    n_split=None,
    blocks_per_iter=4,
    num_warps=4,
    num_stages=3,
):
    """Sparse decode attention; see the module docstring for layouts. Returns ``out`` or ``(out, lse)``.

    ``n_split=None`` picks about four programs per SM (``_util.default_n_split``); ``blocks_per_iter`` slots are
    loaded per loop iteration (a tile of ``blocks_per_iter * block_size`` tokens); ``num_stages - 1`` tiles are in
    flight per program. ``out``/``lse`` may be passed preallocated.
    """
    B, Hq, Tq, D = q.shape
    n_slots, BS, _ = k_slots.shape
    Hkv = slot_ids.shape[1]
    S = slot_ids.shape[2]
    dev = q.device
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    G = Hq // Hkv
    assert D == next_pow2(D) and D >= 16, f"head dim {D} must be a power of 2 >= 16"
    assert BS == next_pow2(BS), f"block_size {BS} must be a power of 2"
    check(q, "q", (B, Hq, Tq, D), (torch.bfloat16, torch.float16), dev)
    check(k_slots, "k_slots", (n_slots, BS, D), q.dtype, dev)
    check(v_slots, "v_slots", (n_slots, BS, D), q.dtype, dev)
    check(slot_ids, "slot_ids", (B, Hkv, S), torch.int32, dev)
    has_local = local_slot is not None
    if has_local:
        check(local_slot, "local_slot", (B, Hkv), torch.int32, dev)
        check(local_len, "local_len", (B,), torch.int32, dev)
    has_extra = extra_k is not None
    if has_extra:
        assert Tq >= 2, "extra_k/extra_v need at least one draft query (Tq >= 2)"
        check(extra_k, "extra_k", (B, Hkv, Tq - 1, D), q.dtype, dev)
        check(extra_v, "extra_v", (B, Hkv, Tq - 1, D), q.dtype, dev)
    if out is None:
        out = torch.empty_like(q)
    check(out, "out", (B, Hq, Tq, D), q.dtype, dev)
    if return_lse:
        if lse is None:
            lse = torch.empty((B, Hq, Tq), dtype=torch.float32, device=dev)
        check(lse, "lse", (B, Hq, Tq), torch.float32, dev, inner_contiguous=0)
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale

    rows = B * Hkv
    n_ent = S + int(has_local)
    bpi = max(1, min(blocks_per_iter, next_pow2(max(n_ent, 1))))
    if n_split is None:
        n_split = default_n_split(rows, cdiv(max(n_ent, 1), bpi), dev)
    n_split = max(1, min(n_split, cdiv(max(n_ent, 1), bpi)))
    n_per_split = cdiv(cdiv(max(n_ent, 1), n_split), bpi) * bpi
    n_split = cdiv(max(n_ent, 1), n_per_split)
    block_m = max(16, next_pow2(G * Tq))
    direct = n_split == 1
    if direct:
        o_part = lse_part = out  # unused
    else:
        o_part = torch.empty((rows, n_split, block_m, D), dtype=torch.float32, device=dev)
        lse_part = torch.empty((rows, n_split, block_m), dtype=torch.float32, device=dev)
    dummy = slot_ids
    ls = local_slot if has_local else dummy
    ll = local_len if has_local else dummy
    ek = extra_k if has_extra else q
    ev = extra_v if has_extra else q
    lse_t = lse if return_lse else out
    sl = lse.stride() if return_lse else (0, 0, 0)
    sparse_attn_kernel[(rows, n_split)](
        q,
        k_slots,
        v_slots,
        slot_ids,
        ls,
        ll,
        ek,
        ev,
        o_part,
        lse_part,
        out,
        lse_t,
        sm_scale * 1.4426950408889634,
        S,
        n_per_split,
        n_split,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_slots.stride(0),
        k_slots.stride(1),
        v_slots.stride(0),
        v_slots.stride(1),
        slot_ids.stride(0),
        slot_ids.stride(1),
        ls.stride(0) if has_local else 0,
        ls.stride(1) if has_local else 0,
        ek.stride(0),
        ek.stride(1),
        ek.stride(2),
        ev.stride(0),
        ev.stride(1),
        ev.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        *sl,
        HKV=Hkv,
        G=G,
        TQ=Tq,
        D=D,
        BS=BS,
        BPI=bpi,
        BLOCK_M=block_m,
        NE_PAD=max(16, next_pow2(max(Tq - 1, 1))),
        HAS_LOCAL=has_local,
        HAS_EXTRA=has_extra,
        DIRECT=direct,
        WRITE_LSE=return_lse,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if not direct:
        merge(o_part, lse_part, out, lse if return_lse else None, Hkv, G, Tq)
    return (out, lse) if return_lse else out


def sparse_attn_ref(
    q, k_slots, v_slots, slot_ids, local_slot=None, local_len=None, extra_k=None, extra_v=None, sm_scale=None
):
    """Plain-torch reference (fp32 gather + softmax). Returns ``(out [B, Hq, Tq, D] in q's dtype, lse fp32)``."""
    B, Hq, Tq, D = q.shape
    _, BS, _ = k_slots.shape
    Hkv, S = slot_ids.shape[1], slot_ids.shape[2]
    G = Hq // Hkv
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    slots = slot_ids.long()
    n_valid = torch.full((B, Hkv, S), BS, device=q.device)
    if local_slot is not None:
        slots = torch.cat([slots, local_slot.long()[:, :, None]], dim=2)
        n_valid = torch.cat([n_valid, local_len.long()[:, None, None].expand(B, Hkv, 1)], dim=2)
    tok = torch.arange(BS, device=q.device)
    valid = (slots[..., None] >= 0) & (tok < n_valid[..., None])  # [B, Hkv, E, BS]
    k = k_slots.float()[slots.clamp(min=0)].reshape(B, Hkv, -1, D)  # [B, Hkv, E*BS, D]
    v = v_slots.float()[slots.clamp(min=0)].reshape(B, Hkv, -1, D)
    valid = valid.reshape(B, Hkv, 1, 1, -1).expand(B, Hkv, G, Tq, -1)
    if extra_k is not None:
        k = torch.cat([k, extra_k.float()], dim=2)
        v = torch.cat([v, extra_v.float()], dim=2)
        x = torch.arange(Tq - 1, device=q.device)
        vis = x[None, :] < torch.arange(Tq, device=q.device)[:, None]  # [Tq, Tq-1]
        valid = torch.cat([valid, vis.expand(B, Hkv, G, Tq, Tq - 1)], dim=-1)
    qf = q.float().reshape(B, Hkv, G, Tq, D)
    logits = torch.einsum("bhgtd,bhnd->bhgtn", qf, k) * sm_scale
    logits = logits.masked_fill(~valid, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    o = torch.einsum("bhgtn,bhnd->bhgtd", p, v)
    return o.reshape(B, Hq, Tq, D).to(q.dtype), lse.reshape(B, Hq, Tq)


def bench_sparse_attn(
    batch=64,
    n_q_heads=32,
    n_kv_heads=8,
    head_dim=128,
    block_size=16,
    top_k=128,
    local_len=9,
    tq=2,
    n_split=None,
    blocks_per_iter=4,
    num_warps=4,
    num_stages=3,
    seed=0,
):
    """GB/s of the resident KV bytes read (top-K + local block per row), against the 4.3 TB/s HBM roofline."""
    from triton.testing import do_bench

    torch.manual_seed(seed)
    dev = torch.device("cuda")
    rows = batch * n_kv_heads
    n_slots = rows * (top_k + 1) + 64
    k_slots = torch.randn(n_slots, block_size, head_dim, device=dev, dtype=torch.bfloat16)
    v_slots = torch.randn_like(k_slots)
    perm = torch.randperm(n_slots, device=dev)[: rows * (top_k + 1)].to(torch.int32)
    slot_ids = perm[: rows * top_k].view(batch, n_kv_heads, top_k).contiguous()
    local_slot = perm[rows * top_k :].view(batch, n_kv_heads).contiguous()
    llen = torch.full((batch,), local_len, dtype=torch.int32, device=dev)
    q = torch.randn(batch, n_q_heads, tq, head_dim, device=dev, dtype=torch.bfloat16)
    ek = torch.randn(batch, n_kv_heads, tq - 1, head_dim, device=dev, dtype=torch.bfloat16) if tq > 1 else None
    ev = torch.randn_like(ek) if ek is not None else None
    out = torch.empty_like(q)
    fn = lambda: sparse_attn(
        q,
        k_slots,
        v_slots,
        slot_ids,
        local_slot,
        llen,
        ek,
        ev,
        out=out,
        n_split=n_split,
        blocks_per_iter=blocks_per_iter,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    fn()
    ref, _ = sparse_attn_ref(
        q[:2],
        k_slots,
        v_slots,
        slot_ids[:2],
        local_slot[:2],
        llen[:2],
        ek[:2] if ek is not None else None,
        ev[:2] if ev is not None else None,
    )
    err = (out[:2].float() - ref.float()).abs().max().item()
    ms = do_bench(fn, warmup=25, rep=200)
    nbytes = rows * (top_k * block_size + local_len) * head_dim * 2 * 2
    gbps = nbytes / ms / 1e6
    return dict(
        kernel="sparse_attn",
        batch=batch,
        top_k=top_k,
        n_split=n_split,
        blocks_per_iter=blocks_per_iter,
        num_warps=num_warps,
        num_stages=num_stages,
        ms=ms,
        bytes=nbytes,
        gbps=gbps,
        roofline_gbps=HBM_ROOFLINE_GBPS,
        frac_roofline=gbps / HBM_ROOFLINE_GBPS,
        max_abs_err=err,
    )
