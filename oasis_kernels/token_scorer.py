"""The per-token block scorer (``oasis_core.token_scorer``, ``--block-score tokens``) in the engine's layout.

Storage (``oasis_exec.kv.token_summaries``), per full layer: ``kp`` [n_seats, Hkv, Nmax, block_size, r], the key
channels ``chan`` [Hkv, r] (int32, a fitted basis's RoPE pairs) of every token of every block; bf16 at r = D / 4 is
2 r bytes a token and KV head, twice the min/max summaries' 2 D / 16 (issue 38's ceiling).

``token_score(q, kp, chan, n_blocks, seat=None, exclude_local=True, scale=None, sink=True)``: q [B, Hq, D],
``n_blocks`` int32 [B] (blocks of each request, its local block included, as ``block_score``'s), ``seat`` int32 [B]
(its row of ``kp``; default the batch index). fp32 [B, Hkv, Nmax]: over the ``E = n_blocks - 1`` eligible blocks
(``n_blocks`` without ``exclude_local``), per query head ``g`` of KV head ``h``
``s_g(n) = log sum_{t in n} exp(c q_g[chan] . kp_t)``, normalised per head over the eligible blocks
(``s_g(n) - log sum_n exp s_g(n)``), then log-sum-exp over the group; block 0 ``+inf`` with ``sink`` (when eligible);
``-inf`` past ``E``. It is ``oasis_core.token_scorer.score`` with the one-hot basis of ``chan`` and ``n_tokens = E *
block_size`` (every eligible block is complete).

Two launches: ``token_block_kernel`` (one program per (request, KV head) x tile of blocks: the gathered query channels
of the group against the tile's tokens, one tensor-core dot, a log-sum-exp per block) writes the per-head block
scores to a scratch [B, Hkv, G, Nmax]; ``token_norm_kernel`` (one program per (request, KV head)) reduces each head's
normaliser over the blocks and writes the pooled scores. ``token_update(k_src, src, dst_row, dst_block, n_valid, kp,
chan)`` writes the items' blocks' channels with ``summary_update``'s item layout (the decode step's writes). Each
has its plain-torch reference (``*_ref``): tests/unit/test_kernels_token_scorer.py.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from oasis_core import token_scorer

from ._util import HBM_ROOFLINE_GBPS, cdiv, check, next_pow2
from .prologue import score_program


@triton.jit
def token_block_kernel(
    Q,
    KP,
    CH,
    SEAT,
    NBLK,
    S,
    Nmax,
    scale,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_sb,
    stride_sh,
    stride_sg,
    HKV: tl.constexpr,
    G: tl.constexpr,
    R: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SEAT: tl.constexpr,
    EXCLUDE_LOCAL: tl.constexpr,
):
    nb, b, h, seat, n_ok = score_program(SEAT, NBLK, HKV, HAS_SEAT, EXCLUDE_LOCAL)
    offs_g = tl.arange(0, BLOCK_G)
    offs_r = tl.arange(0, BLOCK_R)
    g_ok = offs_g < G
    r_ok = offs_r < R
    ch = tl.load(CH + h * R + offs_r, mask=r_ok, other=0)
    q = tl.load(
        Q + b.to(tl.int64) * stride_qb + (h * G + offs_g)[:, None] * stride_qh + ch[None, :],
        mask=g_ok[:, None] & r_ok[None, :],
        other=0.0,
    )  # [BLOCK_G, BLOCK_R]: the group's queries on the kept channels
    offs_t = nb * (BLOCK_N * BS) + tl.arange(0, BLOCK_N * BS)  # tokens of the tile (kp rows: block-major)
    t_ok = (offs_t // BS) < n_ok
    k = tl.load(
        KP + seat.to(tl.int64) * stride_ks + h * stride_kh + offs_t[:, None] * R + offs_r[None, :],
        mask=t_ok[:, None] & r_ok[None, :],
        other=0.0,
    )  # [BLOCK_N * BS, BLOCK_R]
    s = tl.dot(q.to(k.dtype), tl.trans(k)) * scale  # [BLOCK_G, BLOCK_N * BS] fp32
    s = tl.where(t_ok[None, :], s, float("-inf"))
    s3 = tl.reshape(s, (BLOCK_G, BLOCK_N, BS))
    m = tl.max(s3, 2)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    lse = m_safe + tl.log(tl.sum(tl.exp(s3 - m_safe[:, :, None]), 2))  # [BLOCK_G, BLOCK_N]; -inf: no token
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    ptr = S + b.to(tl.int64) * stride_sb + h * stride_sh + offs_g[:, None] * stride_sg + offs_n[None, :]
    tl.store(ptr, lse, mask=g_ok[:, None] & (offs_n < Nmax)[None, :])


@triton.jit
def token_norm_kernel(
    S,
    NBLK,
    OUT,
    Nmax,
    stride_sb,
    stride_sh,
    stride_sg,
    stride_ob,
    stride_oh,
    HKV: tl.constexpr,
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EXCLUDE_LOCAL: tl.constexpr,
    SINK: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // HKV
    h = row % HKV
    n_blk = tl.load(NBLK + b)
    n_ok = n_blk - 1 if EXCLUDE_LOCAL else n_blk
    offs_g = tl.arange(0, BLOCK_G)
    g_ok = offs_g < G
    base = S + b.to(tl.int64) * stride_sb + h * stride_sh + offs_g[:, None] * stride_sg
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    acc = tl.zeros((BLOCK_G,), tl.float32)
    for n0 in range(0, Nmax, BLOCK_N):  # each head's normaliser: an online log-sum-exp over the eligible blocks
        offs_n = n0 + tl.arange(0, BLOCK_N)
        ok = g_ok[:, None] & (offs_n < n_ok)[None, :]
        s = tl.load(base + offs_n[None, :], mask=ok, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        acc = acc * tl.exp(m - m_safe) + tl.sum(tl.exp(s - m_safe[:, None]), 1)
        m = m_new
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    norm = tl.where(acc > 0, m_safe + tl.log(acc), 0.0)  # a head without a valid block: 0, as the core's
    for n0 in range(0, Nmax, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_in = offs_n < n_ok
        s = tl.load(base + offs_n[None, :], mask=g_ok[:, None] & n_in[None, :], other=float("-inf"))
        s = s - norm[:, None]
        mx = tl.max(s, 0)
        mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
        best = mx_safe + tl.log(tl.sum(tl.exp(s - mx_safe[None, :]), 0))
        if SINK:
            best = tl.where(offs_n == 0, float("inf"), best)
        best = tl.where(n_in, best, float("-inf"))
        tl.store(OUT + b.to(tl.int64) * stride_ob + h * stride_oh + offs_n, best, mask=offs_n < Nmax)


def token_score(
    q, kp, chan, n_blocks, seat=None, exclude_local=True, scale=None, sink=True, out=None, block_n=16, num_warps=4
):
    """Scores ``[B, Hkv, Nmax]`` fp32 of every block (see the module docstring)."""
    B, Hq, D = q.shape
    n_seats, Hkv, Nmax, bs, R = kp.shape
    dev = q.device
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    assert bs == next_pow2(bs), f"block size {bs} must be a power of 2"
    check(q, "q", (B, Hq, D), (torch.bfloat16, torch.float16), dev)
    check(kp, "kp", (n_seats, Hkv, Nmax, bs, R), q.dtype, dev, inner_contiguous=3)
    check(chan, "chan", (Hkv, R), torch.int32, dev)
    check(n_blocks, "n_blocks", (B,), torch.int32, dev)
    if seat is not None:
        check(seat, "seat", (B,), torch.int32, dev)
    else:
        assert n_seats >= B, f"without seat, kp needs >= B={B} seats, has {n_seats}"
    G = Hq // Hkv
    if out is None:
        out = torch.empty((B, Hkv, Nmax), dtype=torch.float32, device=dev)
    check(out, "out", (B, Hkv, Nmax), torch.float32, dev)
    block_n = max(cdiv(16, bs), min(block_n, next_pow2(Nmax)))
    block_g = max(16, next_pow2(G))
    # the norm pass has no dot, so its rows are the group's heads only (the block pass pads them to 16 for tl.dot),
    # and a tile of up to 4,096 scores: Qwen3-8B's G = 4 reads a 16K context's 1,024 blocks in one iteration
    norm_g = next_pow2(G)
    scratch = torch.empty((B, Hkv, G, Nmax), dtype=torch.float32, device=dev)
    token_block_kernel[(B * Hkv, cdiv(Nmax, block_n))](
        q,
        kp,
        chan,
        seat if seat is not None else n_blocks,
        n_blocks,
        scratch,
        Nmax,
        float(1.0 / math.sqrt(D) if scale is None else scale),
        q.stride(0),
        q.stride(1),
        kp.stride(0),
        kp.stride(1),
        scratch.stride(0),
        scratch.stride(1),
        scratch.stride(2),
        HKV=Hkv,
        G=G,
        R=R,
        BS=bs,
        BLOCK_G=block_g,
        BLOCK_R=max(16, next_pow2(R)),
        BLOCK_N=block_n,
        HAS_SEAT=seat is not None,
        EXCLUDE_LOCAL=exclude_local,
        num_warps=num_warps,
    )
    token_norm_kernel[(B * Hkv,)](
        scratch,
        n_blocks,
        out,
        Nmax,
        scratch.stride(0),
        scratch.stride(1),
        scratch.stride(2),
        out.stride(0),
        out.stride(1),
        HKV=Hkv,
        G=G,
        BLOCK_G=norm_g,
        BLOCK_N=max(16, min(next_pow2(Nmax), 4096 // norm_g)),
        EXCLUDE_LOCAL=exclude_local,
        SINK=sink,
        num_warps=num_warps,
    )
    return out


def one_hot(chan, head_dim: int):
    """The basis [Hkv, D, r] fp32 of channel ids ``chan`` [Hkv, r] (``oasis_core.token_scorer.channel_basis``)."""
    hkv, r = chan.shape
    basis = torch.zeros(hkv, head_dim, r, device=chan.device)
    return basis.scatter_(1, chan.long()[:, None, :], 1.0)


def token_score_ref(q, kp, chan, n_blocks, seat=None, exclude_local=True, scale=None, sink=True):
    """Plain-torch reference in fp32: ``oasis_core.token_scorer.score`` of each request's seat, with ``n_tokens`` its
    eligible blocks' tokens, then the mask past them."""
    B, _, D = q.shape
    bs, nmax = kp.shape[3], kp.shape[2]
    idx = seat.long() if seat is not None else torch.arange(B, device=q.device)
    elig = (n_blocks.long() - (1 if exclude_local else 0)).clamp(min=0)
    s = token_scorer.score(q.float(), kp[idx].float(), one_hot(chan, D), elig * bs, scale, sink)
    ok = torch.arange(nmax, device=q.device)[None, :] < elig[:, None]
    return torch.where(ok[:, None, :], s, torch.full_like(s, -math.inf))


def project_keys(k, chan):
    """k [..., Hkv, D] -> [..., Hkv, r]: each KV head's kept channels (what ``kp`` holds of a token)."""
    idx = chan.long().expand(*k.shape[:-2], *chan.shape)
    return k.gather(-1, idx)


@triton.jit
def token_update_kernel(
    KSRC,
    SRC,
    ROW,
    BLK,
    NV,
    KP,
    CH,
    stride_src,
    stride_tok,
    stride_row,
    stride_blk,
    HKV: tl.constexpr,
    R: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    i = tl.program_id(0)
    src = tl.load(SRC + i)
    nv = tl.load(NV + i)
    ok = (src >= 0) & (nv > 0)
    src = tl.where(ok, src, 0).to(tl.int64)
    row = tl.where(ok, tl.load(ROW + i), 0).to(tl.int64)
    blk = tl.where(ok, tl.load(BLK + i), 0).to(tl.int64)
    offs_t = tl.arange(0, BS)
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < R
    ch = tl.load(CH + (row % HKV) * R + offs_r, mask=r_ok, other=0)
    k = tl.load(
        KSRC + src * stride_src + offs_t[:, None] * stride_tok + ch[None, :],
        mask=ok & (offs_t < nv)[:, None] & r_ok[None, :],
        other=0.0,
    )
    ptr = KP + row * stride_row + blk * stride_blk + offs_t[:, None] * R + offs_r[None, :]
    tl.store(ptr, k, mask=ok & r_ok[None, :])  # the tokens past n_valid as zeros


def token_update(k_src, src, dst_row, dst_block, n_valid, kp, chan):
    """Each item's source block ``k_src[src]`` ([N_src, bs, D]) projected into ``kp[row // Hkv, row % Hkv, block]``
    (``kp`` [n_seats, Hkv, Nmax, bs, r]): the first ``n_valid`` tokens' channels, zeros after; items with ``src < 0``
    or ``n_valid == 0`` write nothing. One program an item, no host synchronisation."""
    M = src.shape[0]
    _, bs, D = k_src.shape
    Hkv, R = chan.shape
    dev = k_src.device
    check(kp, "kp", (None, Hkv, None, bs, R), k_src.dtype, dev, inner_contiguous=3)
    for t, name in ((src, "src"), (dst_row, "dst_row"), (dst_block, "dst_block"), (n_valid, "n_valid")):
        check(t, name, (M,), torch.int32, dev)
    if M == 0:
        return
    assert k_src.stride(2) == 1, "k_src: the head dim must be contiguous"
    token_update_kernel[(M,)](
        k_src,
        src,
        dst_row,
        dst_block,
        n_valid,
        kp,
        chan,
        k_src.stride(0),
        k_src.stride(1),
        kp.stride(1),
        kp.stride(2),
        HKV=Hkv,
        R=R,
        BS=bs,
        BLOCK_R=max(16, next_pow2(R)),
    )


def token_update_ref(k_src, src, dst_row, dst_block, n_valid, kp, chan):
    """Plain-torch ``token_update`` (boolean indexing: fine on the CPU, a host sync on CUDA)."""
    ok = (src >= 0) & (n_valid > 0)
    src, row, blk, nv = (t[ok].long() for t in (src, dst_row, dst_block, n_valid))
    Hkv = chan.shape[0]
    keys = k_src[src].gather(-1, chan[row % Hkv].long()[:, None, :].expand(-1, k_src.shape[1], -1))  # [M, bs, r]
    valid = torch.arange(keys.shape[1], device=keys.device)[None, :, None] < nv[:, None, None]
    kp[row // Hkv, row % Hkv, blk] = torch.where(valid, keys, torch.zeros_like(keys)).to(kp.dtype)


def bench_token_score(batch=44, n_q_heads=32, n_kv_heads=8, head_dim=128, context=16384, rank=32, block_size=16):
    """Time of ``token_score`` (the kernels) on the GPU at a shape (bf16 storage), and the bytes of ``kp`` it reads
    (GB/s against the HBM roofline)."""
    from triton.testing import do_bench

    dev = torch.device("cuda")
    n = context // block_size
    kp = torch.randn(batch, n_kv_heads, n, block_size, rank, device=dev, dtype=torch.bfloat16)
    chan = torch.as_tensor(token_scorer.first_pairs(n_kv_heads, head_dim, rank), device=dev)
    q = torch.randn(batch, n_q_heads, head_dim, device=dev, dtype=torch.bfloat16)
    nb = torch.full((batch,), n, dtype=torch.int32, device=dev)
    ms = do_bench(lambda: token_score(q, kp, chan, nb), warmup=10, rep=100)
    ms_ref = do_bench(lambda: token_score_ref(q, kp, chan, nb), warmup=3, rep=20)
    gb = kp.numel() * 2 / 1e9
    return dict(kernel="token_score", batch=batch, context=context, rank=rank, ms=ms, ms_torch_ref=ms_ref,
                bytes=kp.numel() * 2, gbps=gb / (ms / 1e3), roofline_gbps=HBM_ROOFLINE_GBPS)  # fmt: skip
