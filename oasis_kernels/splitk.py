"""Merge of split-K (flash-decoding) partial attention results, shared by ``sparse_attn`` and ``paged_attn``.

Each attention program handles one (request b, KV head h) row and one split of its keys, and writes
for its ``BLOCK_M`` query rows (row m = g * Tq + t: query head h * G + g, query position t):

- ``o_part[R, n_split, BLOCK_M, D]`` fp32: the split's softmax-normalised output (0 where the split saw no key);
- ``lse_part[R, n_split, BLOCK_M]`` fp32: the split's log-sum-exp in base 2 of the scaled logits (-inf if empty).

``R = B * Hkv`` with row r = b * Hkv + h. The merge weights each split by ``2**(lse - max lse)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

LN2 = 0.6931471805599453


@triton.jit
def splitk_merge_kernel(
    O_PART,
    LSE_PART,
    OUT,
    LSE_OUT,
    n_split,
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
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // HKV
    h = row % HKV
    offs_s = tl.arange(0, BLOCK_S)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    s_ok = offs_s < n_split
    base_l = LSE_PART + row.to(tl.int64) * n_split * BLOCK_M
    lse = tl.load(base_l + offs_s[:, None] * BLOCK_M + offs_m[None, :], mask=s_ok[:, None], other=float("-inf"))
    mx = tl.max(lse, 0)  # [BLOCK_M]
    mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse - mx_safe[None, :])  # [BLOCK_S, BLOCK_M], 0 for empty splits
    wsum = tl.sum(w, 0)
    base_o = O_PART + row.to(tl.int64) * n_split * BLOCK_M * D
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for s in range(0, n_split):
        o = tl.load(base_o + s * BLOCK_M * D + offs_m[:, None] * D + offs_d[None, :])
        ws = tl.sum(tl.where(offs_s[:, None] == s, w, 0.0), 0)  # weight of split s per query row
        acc += o * ws[:, None]
    out = acc / tl.where(wsum > 0, wsum, 1.0)[:, None]
    g = offs_m // TQ
    t = offs_m % TQ
    m_ok = offs_m < G * TQ
    o_ptr = (
        OUT + b.to(tl.int64) * stride_ob + (h * G + g)[:, None] * stride_oh + t[:, None] * stride_ot + offs_d[None, :]
    )
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=m_ok[:, None])
    if WRITE_LSE:
        lse_tot = tl.where(
            wsum > 0, (mx_safe + tl.log2(tl.where(wsum > 0, wsum, 1.0))) * 0.6931471805599453, float("-inf")
        )
        tl.store(LSE_OUT + b.to(tl.int64) * stride_lb + (h * G + g) * stride_lh + t * stride_lt, lse_tot, mask=m_ok)


def merge(o_part, lse_part, out, lse_out, n_kv_heads: int, group: int, tq: int):
    """Launch the merge. ``out`` is [B, Hq, Tq, D] or [B, Hq, D] (Tq = 1); ``lse_out`` the same without D, or None."""
    R, n_split, block_m, D = o_part.shape
    so = out.stride()
    o_strides = (so[0], so[1], so[2] if out.dim() == 4 else 0)
    if lse_out is not None:
        sl = lse_out.stride()
        l_strides = (sl[0], sl[1], sl[2] if lse_out.dim() == 3 else 0)
    else:
        l_strides = (0, 0, 0)
    splitk_merge_kernel[(R,)](
        o_part,
        lse_part,
        out,
        lse_out if lse_out is not None else o_part,
        n_split,
        *o_strides,
        *l_strides,
        HKV=n_kv_heads,
        G=group,
        TQ=tq,
        D=D,
        BLOCK_M=block_m,
        BLOCK_S=max(2, triton.next_power_of_2(n_split)),
        WRITE_LSE=lse_out is not None,
        num_warps=4,
    )


@triton.jit
def online_softmax_step(q, k, v, valid, m_i, l_i, acc, qk_scale):
    """One flash-attention step: ``q [M, D]``, ``k, v [N, D]``, ``valid [M, N]`` (or broadcastable) bool,
    running max ``m_i [M]`` and sum ``l_i [M]`` in base 2, ``acc [M, D]`` fp32. Returns the updated triple.
    Rows that have seen no valid key keep m = -inf, l = 0, acc = 0 (no NaN)."""
    s = tl.dot(q, tl.trans(k)) * qk_scale
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def store_partial_or_final(
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
    HKV: tl.constexpr,
    G: tl.constexpr,
    TQ: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DIRECT: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    """Write a program's result: the final output when there is one split (``DIRECT``), else the partial."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    if DIRECT:
        b = row // HKV
        h = row % HKV
        g = offs_m // TQ
        t = offs_m % TQ
        m_ok = offs_m < G * TQ
        o_ptr = (
            OUT
            + b.to(tl.int64) * stride_ob
            + (h * G + g)[:, None] * stride_oh
            + t[:, None] * stride_ot
            + offs_d[None, :]
        )
        tl.store(o_ptr, o.to(OUT.dtype.element_ty), mask=m_ok[:, None])
        if WRITE_LSE:
            tl.store(
                LSE_OUT + b.to(tl.int64) * stride_lb + (h * G + g) * stride_lh + t * stride_lt,
                lse2 * 0.6931471805599453,
                mask=m_ok,
            )
    else:
        base = (row.to(tl.int64) * n_split + split) * BLOCK_M
        tl.store(O_PART + (base + offs_m)[:, None] * D + offs_d[None, :], o)
        tl.store(LSE_PART + base + offs_m, lse2)
