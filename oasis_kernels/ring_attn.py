"""Decode attention over a sliding-window layer's ring (``oasis_exec.kv.ring.RingKV``), read in place (split-K, GQA).

Layout (one call per layer):

- ``k_ring, v_ring: [max_lanes, Hkv, R, D]`` bf16/fp16/fp32, the layer's rings: lane ``n`` keeps the token at
  position ``p`` in slot ``p % R`` (``R = W + extra``). Only the last dim must be contiguous.
- ``lanes: [B]`` int32/int64: the ring row of each batch row, any subset / order of ``0 .. max_lanes - 1``; read on
  the device (no gather copy of the rings).
- ``qpos: [B, nq]`` int32/int64: each query's position (``nq > 1``: a speculative step's drafts), ``>= 0``; its own
  K/V already written to the ring.
- ``q: [B, nq, Hq, D]`` (the ring's dtype), ``Hq = G * Hkv``, query head ``h * G + g`` reads KV head ``h``.

The window mask is ``RingKV.attend``'s, computed from the positions: for a query at ``q``, slot ``i`` holds position
``q - ((q - i) mod R)``, valid when it is ``>= 0`` and ``q - held < W`` (i.e. ``(q - i) mod R < W``). Program
(b * Hkv + h, split) covers a contiguous range of slots, ``BLOCK_N`` a loop iteration, once for all ``G * nq`` queries
of the row; ``splitk.merge`` combines splits (one split writes the output itself). A slot no query of the row sees is
not read, and where no query of the row has wrapped the ring its unseen slots are not visited at all.

Precision: scores, softmax and accumulation in fp32, as the torch path (``_attn``: fp32 einsums). The score dot's
products are exact (bf16 / fp16 products fit fp32; fp32 operands use ``input_precision="ieee"``, never tf32). The
probability-times-V dot keeps the fp32 probabilities: for a bf16 ring they go as three bf16 terms (hi + mid + lo,
8 bits each: the 24 bits of fp32) through the tensor cores; for fp16 / fp32 rings V is widened to fp32 and the dot is
``ieee``. Returns ``out [B, nq, Hq, D]`` in q's dtype (or the fp32 result, into a given fp32 ``out``). No host
synchronisation, shapes from the arguments only (capturable in a CUDA graph).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._util import HBM_ROOFLINE_GBPS, cdiv, check, default_n_split, next_pow2, num_sms
from .splitk import merge, store_partial_or_final


@triton.jit
def ring_attn_kernel(
    Q,
    K,
    V,
    LANES,
    QPOS,
    O_PART,
    LSE_PART,
    OUT,
    qk_scale,
    R,
    W,
    n_per_split,
    n_split,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kl,
    stride_kh,
    stride_kr,
    stride_vl,
    stride_vh,
    stride_vr,
    stride_lane,
    stride_pb,
    stride_pt,
    stride_ob,
    stride_oh,
    stride_ot,
    HKV: tl.constexpr,
    G: tl.constexpr,
    TQ: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PV_BF16X3: tl.constexpr,
    IEEE: tl.constexpr,
    DIRECT: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    g = offs_m // TQ
    t = offs_m % TQ
    m_ok = offs_m < G * TQ
    q = tl.load(
        Q + b.to(tl.int64) * stride_qb + t[:, None] * stride_qt + (h * G + g)[:, None] * stride_qh + offs_d[None, :],
        mask=m_ok[:, None],
        other=0.0,
    )  # [BLOCK_M, D]
    qp = tl.load(QPOS + b.to(tl.int64) * stride_pb + t * stride_pt, mask=m_ok, other=0).to(tl.int32)
    qm = qp % R
    qm = tl.where(qm < 0, qm + R, qm)  # q mod R, so that (q - i) mod R = qm - i (+ R when negative)
    lane = tl.load(LANES + b * stride_lane).to(tl.int64)
    k_base = K + lane * stride_kl + h.to(tl.int64) * stride_kh
    v_base = V + lane * stride_vl + h.to(tl.int64) * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    start = split * n_per_split
    end = tl.minimum(start + n_per_split, R)
    # Where no query of the row has wrapped the ring (every position < R), slot i holds position i and the slots the
    # row's queries can see are qmin - W + 1 .. qmax: the loop visits only those (the draft head's whole-window ring
    # at a context shorter than its buffer, a sliding layer's first R positions); else every slot of the split.
    qmax = tl.max(tl.where(m_ok, qp, -1), 0)
    qmin = tl.min(tl.where(m_ok, qp, R), 0)
    lo = tl.where(qmax < R, tl.maximum(start, qmin - W + 1), start)
    hi = tl.where(qmax < R, tl.minimum(end, qmax + 1), end)
    for n0 in tl.range(lo, hi, BLOCK_N):
        i = n0 + offs_n  # [BLOCK_N] slots
        age = qm[:, None] - i[None, :]
        age = tl.where(age < 0, age + R, age)  # (q - i) mod R: q minus the position slot i holds
        valid = m_ok[:, None] & (i < end)[None, :] & (age < W) & (qp[:, None] - age >= 0)  # [BLOCK_M, BLOCK_N]
        seen = tl.max(valid.to(tl.int32), 0) > 0  # slots some query of the row sees: the only ones read
        k = tl.load(k_base + i[:, None] * stride_kr + offs_d[None, :], mask=seen[:, None], other=0.0)
        v = tl.load(v_base + i[:, None] * stride_vr + offs_d[None, :], mask=seen[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(valid, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])  # fp32 probabilities (unnormalised)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if PV_BF16X3:
            p_hi = p.to(tl.bfloat16)
            r1 = p - p_hi.to(tl.float32)
            p_mid = r1.to(tl.bfloat16)
            p_lo = (r1 - p_mid.to(tl.float32)).to(tl.bfloat16)
            acc = tl.dot(p_hi, v, acc)
            acc = tl.dot(p_mid, v, acc)
            acc = tl.dot(p_lo, v, acc)
        else:
            acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
        m_i = m_new

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
        OUT,
        stride_ob,
        stride_oh,
        stride_ot,
        0,
        0,
        0,
        HKV,
        G,
        TQ,
        D,
        BLOCK_M,
        DIRECT,
        False,
    )


def ring_attn(
    q,
    k_ring,
    v_ring,
    lanes,
    qpos,
    window: int,
    sm_scale=None,
    out=None,
    n_split=None,
    block_n=16,
    num_warps=4,
    num_stages=3,
):
    """Ring attention of a sliding layer; see the module docstring for layouts. Returns ``out [B, nq, Hq, D]``.

    ``n_split=None``: one program a row (no split) once the rows fill half the SMs, else about four programs per SM
    (``_util.default_n_split``). Measured on an H100 (2026-12-06, db51c33, Gemma 3 270M's 15 sliding layers at 128
    lanes, ``results/gemma_32k_h100_db51c33/``): 0.65 ms unsplit against 1.19-1.25 ms with 2-6 splits, whatever the
    tile, warps and stages (16 / 32 / 64, 4 / 8, 2-4: within 2%; the defaults are the unsplit run's). ``block_n`` slots are loaded per
    loop iteration; ``out`` may be passed preallocated (any strides with a contiguous last dim), in q's dtype or in
    float32 (the fp32 result before its rounding to q's dtype).
    """
    B, nq, Hq, D = q.shape
    n_lanes, Hkv, R, _ = k_ring.shape
    dev = q.device
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    G = Hq // Hkv
    assert D == next_pow2(D) and D >= 16, f"head dim {D} must be a power of 2 >= 16"
    assert 1 <= window <= R, f"window {window} must be in 1..R={R}"
    assert block_n == next_pow2(block_n) and block_n >= 16, f"block_n {block_n} must be a power of 2 >= 16"
    check(q, "q", (B, nq, Hq, D), (torch.bfloat16, torch.float16, torch.float32), dev)
    check(k_ring, "k_ring", (n_lanes, Hkv, R, D), q.dtype, dev)
    check(v_ring, "v_ring", (n_lanes, Hkv, R, D), q.dtype, dev)
    check(lanes, "lanes", (B,), (torch.int32, torch.int64), dev, inner_contiguous=0)
    check(qpos, "qpos", (B, nq), (torch.int32, torch.int64), dev, inner_contiguous=0)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    check(out, "out", (B, nq, Hq, D), (q.dtype, torch.float32), dev)
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale

    rows = B * Hkv
    n_tiles = cdiv(R, block_n)
    if n_split is None:
        n_split = 1 if rows >= num_sms(dev) // 2 else default_n_split(rows, n_tiles, dev)
    n_split = max(1, min(n_split, n_tiles))
    n_per_split = cdiv(n_tiles, n_split) * block_n
    n_split = cdiv(R, n_per_split)
    block_m = max(16, next_pow2(G * nq))
    direct = n_split == 1
    out_t = out.transpose(1, 2)  # [B, Hq, nq, D] view: the (b, head, t) order store_partial_or_final and merge use
    if direct:
        o_part = lse_part = out  # unused
    else:
        o_part = torch.empty((rows, n_split, block_m, D), dtype=torch.float32, device=dev)
        lse_part = torch.empty((rows, n_split, block_m), dtype=torch.float32, device=dev)
    ring_attn_kernel[(rows, n_split)](
        q,
        k_ring,
        v_ring,
        lanes,
        qpos,
        o_part,
        lse_part,
        out,
        sm_scale * 1.4426950408889634,
        R,
        window,
        n_per_split,
        n_split,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_ring.stride(0),
        k_ring.stride(1),
        k_ring.stride(2),
        v_ring.stride(0),
        v_ring.stride(1),
        v_ring.stride(2),
        lanes.stride(0),
        qpos.stride(0),
        qpos.stride(1),
        out_t.stride(0),
        out_t.stride(1),
        out_t.stride(2),
        HKV=Hkv,
        G=G,
        TQ=nq,
        D=D,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PV_BF16X3=q.dtype == torch.bfloat16,
        IEEE=q.dtype == torch.float32,
        DIRECT=direct,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if not direct:
        merge(o_part, lse_part, out_t, None, Hkv, G, nq)
    return out


def ring_valid(qpos, R: int, window: int):
    """The window mask [B, nq, R] of queries at ``qpos`` [B, nq] over a ring of ``R`` slots (``RingKV.attend``'s)."""
    slot = torch.arange(R, device=qpos.device)
    held = qpos[..., None] - torch.remainder(qpos[..., None] - slot, R)  # position in each slot
    return (held >= 0) & (qpos[..., None] - held < window)


def ring_attn_ref(q, k_ring, v_ring, lanes, qpos, window: int, sm_scale=None):
    """Plain-torch reference (the rings gathered, fp32 einsums and softmax; ``RingKV.attend``'s CPU path)."""
    B, nq, Hq, D = q.shape
    k, v = k_ring[lanes].float(), v_ring[lanes].float()  # [B, H, R, D]
    H, R = k.shape[1], k.shape[2]
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    valid = ring_valid(qpos, R, window)
    s = torch.einsum("bnhgd,bhtd->bnhgt", q.float().view(B, nq, H, Hq // H, D), k) * sm_scale
    s = s.masked_fill(~valid[:, :, None, None, :], -math.inf)
    o = torch.einsum("bnhgt,bhtd->bnhgd", torch.softmax(s, -1), v)
    return o.reshape(B, nq, Hq, D).to(q.dtype)


def bench_ring_attn(
    batch=128,
    n_q_heads=4,
    n_kv_heads=1,
    head_dim=256,
    window=512,
    extra=1,
    nq=1,
    n_split=None,
    block_n=32,
    num_warps=4,
    num_stages=2,
    layers=15,
    seed=0,
):
    """Gemma 3 270M's sliding layers by default: one call per layer over ``layers`` distinct rings (so that nothing
    stays in L2), against the torch path (gather + fp32 einsums). GB/s of the ring bytes read."""
    from triton.testing import do_bench

    torch.manual_seed(seed)
    dev = torch.device("cuda")
    R = window + extra
    dt = torch.bfloat16
    rings = [
        (
            torch.randn(batch, n_kv_heads, R, head_dim, device=dev, dtype=dt),
            torch.randn(batch, n_kv_heads, R, head_dim, device=dev, dtype=dt),
        )
        for _ in range(layers)
    ]
    lanes = torch.randperm(batch, device=dev)
    qpos = (32000 + torch.randint(0, 1000, (batch, 1), device=dev) + torch.arange(nq, device=dev)).long()
    q = torch.randn(batch, nq, n_q_heads, head_dim, device=dev, dtype=dt)
    out = torch.empty_like(q)
    kw = dict(n_split=n_split, block_n=block_n, num_warps=num_warps, num_stages=num_stages)

    def fn():
        for k, v in rings:
            ring_attn(q, k, v, lanes, qpos, window, out=out, **kw)

    def fn_ref():
        for k, v in rings:
            ring_attn_ref(q, k, v, lanes, qpos, window)

    fn()
    ref = ring_attn_ref(q, *rings[-1], lanes, qpos, window)
    err = (out.float() - ref.float()).abs().max().item()
    ms = do_bench(fn, warmup=25, rep=200)
    ms_ref = do_bench(fn_ref, warmup=5, rep=50)
    nbytes = layers * batch * n_kv_heads * min(R, window + nq - 1) * head_dim * 2 * 2
    gbps = nbytes / ms / 1e6
    return dict(
        kernel="ring_attn",
        batch=batch,
        layers=layers,
        nq=nq,
        n_split=n_split,
        block_n=block_n,
        num_warps=num_warps,
        num_stages=num_stages,
        ms=ms,
        ms_torch=ms_ref,
        bytes=nbytes,
        gbps=gbps,
        roofline_gbps=HBM_ROOFLINE_GBPS,
        frac_roofline=gbps / HBM_ROOFLINE_GBPS,
        max_abs_err=err,
    )
