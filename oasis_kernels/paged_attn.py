"""Paged dense decode attention for the dense baseline (split-K flash-decoding, GQA).

Layout (one call per layer):

- ``k_cache, v_cache: [n_pages, Hkv, page_size, D]`` bf16/fp16: one page holds ``page_size`` tokens of every KV
  head, and one (page, head) is contiguous (page_size * D elements; 4 KiB at 16 x 128 bf16), the same layout as the
  host pool and the GPU slots of the sparse path, so a (page, head) is one slot's worth of bytes. Strides of the
  first two dims are free, the last two dims must be contiguous.
- ``block_table: [B, max_pages]`` int32: page of each logical block of request b (entries past the request's
  last page are never read);
- ``seq_lens: [B]`` int32: tokens of each request, the current token included (its KV already written);
- ``q: [B, Hq, D]``, ``Hq = G * Hkv``, query head ``h * G + g`` reads KV head ``h``.

Returns ``out [B, Hq, D]`` (q's dtype) and optionally ``lse [B, Hq]`` fp32. Program (b * Hkv + h, split) reads the
split's share of the request's pages, ``pages_per_iter`` pages per loop iteration, once for the whole query group;
``splitk.merge`` combines splits (one split writes the output directly).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._util import HBM_ROOFLINE_GBPS, cdiv, check, default_n_split, next_pow2
from .splitk import merge, online_softmax_step, store_partial_or_final


@triton.jit
def paged_attn_kernel(
    Q,
    K,
    V,
    BT,
    SEQ,
    O_PART,
    LSE_PART,
    OUT,
    LSE_OUT,
    qk_scale,
    n_split,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kh,
    stride_vp,
    stride_vh,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_lb,
    stride_lh,
    HKV: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    PPI: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DIRECT: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(
        Q + b.to(tl.int64) * stride_qb + (h * G + offs_m)[:, None] * stride_qh + offs_d[None, :],
        mask=(offs_m < G)[:, None],
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    seq_len = tl.load(SEQ + b)
    n_pages = (seq_len + BS - 1) // BS
    per_split = ((n_pages + n_split - 1) // n_split + PPI - 1) // PPI * PPI
    start = split * per_split
    end = tl.minimum(start + per_split, n_pages)
    offs_n = tl.arange(0, PPI * BS)
    pg_in = offs_n // BS
    tok = offs_n % BS
    bt_row = BT + b.to(tl.int64) * stride_bt
    k_base = K + h * stride_kh
    v_base = V + h * stride_vh
    # The page ids of iteration i + 1 are loaded in iteration i, so the K/V loads do not wait on a load of their
    # own iteration and the software pipeliner can keep several K/V tiles in flight.
    page_next = tl.load(bt_row + start + pg_in, mask=start + pg_in < end, other=0)
    for p0 in range(start, end, PPI):
        p = p0 + pg_in
        valid = (p < end) & (p * BS + tok < seq_len)
        page = page_next.to(tl.int64)
        page_next = tl.load(bt_row + p + PPI, mask=p + PPI < end, other=0)
        k = tl.load(
            k_base + page[:, None] * stride_kp + (tok * D)[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0
        )
        v = tl.load(
            v_base + page[:, None] * stride_vp + (tok * D)[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0
        )
        m_i, l_i, acc = online_softmax_step(q, k, v, valid[None, :], m_i, l_i, acc, qk_scale)

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
        0,
        stride_lb,
        stride_lh,
        0,
        HKV,
        G,
        1,
        D,
        BLOCK_M,
        DIRECT,
        WRITE_LSE,
    )


def paged_attn(
    q,
    k_cache,
    v_cache,
    block_table,
    seq_lens,
    sm_scale=None,
    return_lse=False,
    out=None,
    lse=None,
    n_split=None,
    pages_per_iter=4,
    num_warps=4,
    num_stages=3,
):
    """Paged dense decode attention; see the module docstring for layouts. Returns ``out`` or ``(out, lse)``.

    ``n_split=None`` picks about four programs per SM (``_util.default_n_split``); ``pages_per_iter`` pages form
    one tile of ``pages_per_iter * page_size`` tokens; ``num_stages - 1`` tiles are in flight per program.
    """
    B, Hq, D = q.shape
    n_pages, Hkv, BS, _ = k_cache.shape
    max_pages = block_table.shape[1]
    dev = q.device
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    G = Hq // Hkv
    assert D == next_pow2(D) and D >= 16, f"head dim {D} must be a power of 2 >= 16"
    assert BS == next_pow2(BS), f"page_size {BS} must be a power of 2"
    check(q, "q", (B, Hq, D), (torch.bfloat16, torch.float16), dev)
    check(k_cache, "k_cache", (n_pages, Hkv, BS, D), q.dtype, dev, inner_contiguous=2)
    check(v_cache, "v_cache", (n_pages, Hkv, BS, D), q.dtype, dev, inner_contiguous=2)
    check(block_table, "block_table", (B, max_pages), torch.int32, dev)
    check(seq_lens, "seq_lens", (B,), torch.int32, dev)
    if out is None:
        out = torch.empty_like(q)
    check(out, "out", (B, Hq, D), q.dtype, dev)
    if return_lse:
        if lse is None:
            lse = torch.empty((B, Hq), dtype=torch.float32, device=dev)
        check(lse, "lse", (B, Hq), torch.float32, dev, inner_contiguous=0)
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    ppi = max(1, min(pages_per_iter, next_pow2(max_pages)))
    if n_split is None:
        n_split = default_n_split(B * Hkv, cdiv(max_pages, ppi), dev)
    block_m = max(16, next_pow2(G))
    rows = B * Hkv
    direct = n_split == 1
    if direct:
        o_part = lse_part = out
    else:
        o_part = torch.empty((rows, n_split, block_m, D), dtype=torch.float32, device=dev)
        lse_part = torch.empty((rows, n_split, block_m), dtype=torch.float32, device=dev)
    lse_t = lse if return_lse else out
    sl = lse.stride() if return_lse else (0, 0)
    paged_attn_kernel[(rows, n_split)](
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        o_part,
        lse_part,
        out,
        lse_t,
        sm_scale * 1.4426950408889634,
        n_split,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        *sl,
        HKV=Hkv,
        G=G,
        D=D,
        BS=BS,
        PPI=ppi,
        BLOCK_M=block_m,
        DIRECT=direct,
        WRITE_LSE=return_lse,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if not direct:
        merge(o_part, lse_part, out, lse if return_lse else None, Hkv, G, 1)
    return (out, lse) if return_lse else out


def paged_attn_ref(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
    """Plain-torch reference: per request, gather its pages, fp32 softmax. Returns ``(out, lse)``."""
    B, Hq, D = q.shape
    _, Hkv, BS, _ = k_cache.shape
    G = Hq // Hkv
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    outs, lses = [], []
    for b in range(B):
        L = int(seq_lens[b])
        pages = block_table[b, : -(-L // BS)].long()
        k = k_cache[pages].float().permute(1, 0, 2, 3).reshape(Hkv, -1, D)[:, :L]  # [Hkv, L, D]
        v = v_cache[pages].float().permute(1, 0, 2, 3).reshape(Hkv, -1, D)[:, :L]
        qb = q[b].float().reshape(Hkv, G, D)
        logits = torch.einsum("hgd,hld->hgl", qb, k) * sm_scale
        lse = torch.logsumexp(logits, -1)
        o = torch.einsum("hgl,hld->hgd", torch.softmax(logits, -1), v)
        outs.append(o.reshape(Hq, D))
        lses.append(lse.reshape(Hq))
    return torch.stack(outs).to(q.dtype), torch.stack(lses)


def bench_paged_attn(
    batch=32,
    n_q_heads=32,
    n_kv_heads=8,
    head_dim=128,
    context=16384,
    page_size=16,
    n_split=None,
    pages_per_iter=4,
    num_warps=4,
    num_stages=3,
    seed=0,
):
    """GB/s of the KV bytes read (whole contexts), against the 4.3 TB/s HBM roofline."""
    from triton.testing import do_bench

    torch.manual_seed(seed)
    dev = torch.device("cuda")
    pages_per_req = cdiv(context, page_size)
    n_pages = batch * pages_per_req
    k_cache = torch.randn(n_pages, n_kv_heads, page_size, head_dim, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    block_table = torch.randperm(n_pages, device=dev).to(torch.int32).view(batch, pages_per_req).contiguous()
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    q = torch.randn(batch, n_q_heads, head_dim, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    fn = lambda: paged_attn(
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        out=out,
        n_split=n_split,
        pages_per_iter=pages_per_iter,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    fn()
    ref, _ = paged_attn_ref(q[:1], k_cache, v_cache, block_table[:1], seq_lens[:1])
    err = (out[:1].float() - ref.float()).abs().max().item()
    ms = do_bench(fn, warmup=25, rep=200)
    nbytes = batch * context * n_kv_heads * head_dim * 2 * 2
    gbps = nbytes / ms / 1e6
    return dict(
        kernel="paged_attn",
        batch=batch,
        context=context,
        n_split=n_split,
        pages_per_iter=pages_per_iter,
        num_warps=num_warps,
        num_stages=num_stages,
        ms=ms,
        bytes=nbytes,
        gbps=gbps,
        roofline_gbps=HBM_ROOFLINE_GBPS,
        frac_roofline=gbps / HBM_ROOFLINE_GBPS,
        max_abs_err=err,
    )
