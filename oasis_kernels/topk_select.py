"""The top-K blocks of every row of block scores in one launch: ``oasis_core.scoring.topk_blocks``, exactly.

``oasis_core.scoring.topk_blocks`` on torch is about a dozen small kernels (eligibility mask, a stable descending
sort, a gather, selects). In a lookahead step they run on the prediction stream between a layer's scores and its
plan, which that layer's copy waits for; with copies beside the step they cost 3-5 ms a 16K token
(``experiments/dense_vs_lookahead_throughput/results/topk_fused_85a86bf/``). Here one program selects one row.

Layout:

- ``scores: [R, N]`` float (any float dtype; compared as float32), rows ``r = b * heads + h``;
- ``n_blocks: [R // heads]`` integer, blocks of request ``b``'s context including the partial local block: blocks
  ``>= n_blocks[b] - 1`` (the local block and beyond) are never chosen;
- returns ``ids: [R, k]`` int64, best first, ties to the lower block id, -1 where a row has fewer than ``k``
  eligible blocks (eligible scores must not be NaN; an eligible ``-inf`` still ranks above every ineligible block).

Each score is made an order-preserving integer (its float32 bits, negatives flipped; -0.0 taken as +0.0). The
K-th largest of them is found bit by bit (32 counts over the row), which selects every block above it and, of those
equal to it, the lowest ids: exactly K. Their int64 keys (the score in the high bits, ``2**31 - 1 - id`` in the low;
all keys differ) are packed into the output row, and each key's rank among the K (a K x K count) is its place.
A first version sorted the whole row (``tl.sort``, a bitonic network): 4 ms of GPU a 16K x 16 step, more than the
torch sort it replaced (``results/figures_topk_vllm_2746686/``). Finding the threshold 2, 4 or 8 bits a pass (each
pass counting the row against every value of the digit at once) was slower on the H200: alone 23-30 us a launch at
16K x 44 against 22 us, and 16.64 against 15.30 ms a 16K x 44 token in the engine at 4 bits
(``results/figures_topk_vllm_5ce928b/``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._util import HBM_ROOFLINE_GBPS, check, next_pow2

MAX_K = 1024  # the rank step holds a BLOCK_K x BLOCK_K tile: Triton allows 2**20 elements; past it, the torch path
LOW = 2**31 - 1  # a key's low bits: LOW - block id (ids < 2**31); the kernel spells it 0x7FFFFFFF (a global is refused)


@triton.jit
def kth_largest(keys, need, HI: tl.constexpr):
    """The largest ``t`` with ``#{keys >= t} >= need``: the ``need``-th largest of non-negative int64 ``keys`` below
    ``2**(HI + 1)``, found bit by bit from bit ``HI`` (``HI + 1`` counts over the row). Shared with
    ``oasis_kernels.attend_slots``."""
    t = tl.zeros((), dtype=tl.int64)
    for b in tl.static_range(HI, -1, -1):
        cand = t | (1 << b)
        t = tl.where(tl.sum((keys >= cand).to(tl.int32), axis=0) >= need, cand, t)
    return t


@triton.jit
def topk_select_kernel(
    S, NBLK, OUT, N, stride_s, K: tl.constexpr, HEADS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    row = tl.program_id(0)
    nb = tl.load(NBLK + row // HEADS).to(tl.int32)
    offs = tl.arange(0, BLOCK_N)
    s = tl.load(S + row * stride_s + offs, mask=offs < N, other=float("-inf")).to(tl.float32)
    s = tl.where(offs < nb - 1, s, float("-inf"))
    s = tl.where(s == 0.0, 0.0, s)  # -0.0 and +0.0 are equal scores: one bit pattern
    bits = s.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed int32, monotonic in the float
    # 1. the K-th largest score, bit by bit from the top (u: 0 .. 2**32 - 1)
    u = ordered.to(tl.int64) + 0x80000000
    t = kth_largest(u, K, 31)
    # 2. every score above it, and of those equal to it the lowest ids, K in all (BLOCK_N >= K)
    eq = u == t
    need = K - tl.sum((u > t).to(tl.int32), axis=0)
    sel = (u > t) | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need))
    # 3. their keys, packed into the output row (scratch), then each one's rank among them: its place, best first
    key = (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - offs).to(tl.int64)
    pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(OUT + row * K + pos, key, mask=sel)
    tl.debug_barrier()
    ok = tl.arange(0, BLOCK_K)
    kk = tl.load(OUT + row * K + ok, mask=ok < K, other=-(2**63))
    rank = tl.sum((kk[None, :] > kk[:, None]).to(tl.int32), axis=1)
    ids = 0x7FFFFFFF - (kk & 0x7FFFFFFF).to(tl.int32)
    out = tl.where(ids < nb - 1, ids, -1).to(tl.int64)
    tl.debug_barrier()  # every key read before any slot is overwritten
    tl.store(OUT + row * K + rank, out, mask=ok < K)


def topk_select(scores: torch.Tensor, k: int, n_blocks: torch.Tensor, heads: int = 1, out=None, num_warps=4):
    """Top-``k`` block ids of each row of ``scores`` [R, N] (``R = len(n_blocks) * heads``), as
    ``oasis_core.scoring.topk_blocks(scores, k, n_blocks.repeat_interleave(heads))``; one launch, no host sync."""
    R, N = scores.shape
    assert k >= 0, f"k: must be >= 0, got {k}"
    assert heads >= 1 and R % heads == 0, f"rows ({R}) must be a multiple of heads ({heads})"
    check(scores, "scores", (R, N), None, None)
    check(n_blocks, "n_blocks", (R // heads,), None, scores.device)
    assert N < LOW, f"N ({N}) must be < 2**31 - 1"
    if out is None:
        out = torch.empty((R, k), dtype=torch.int64, device=scores.device)
    check(out, "out", (R, k), torch.int64, scores.device)
    if R == 0 or k == 0:
        return out
    if next_pow2(k) > MAX_K:  # e.g. K covering every block of a 32K context: the reference, exact and sync-free
        return out.copy_(topk_select_ref(scores, k, n_blocks, heads))
    topk_select_kernel[(R,)](
        scores,
        n_blocks,
        out,
        N,
        scores.stride(0),
        K=k,
        HEADS=heads,
        BLOCK_N=next_pow2(max(N, k)),
        BLOCK_K=next_pow2(k),
        num_warps=num_warps,
    )
    return out


def topk_select_ref(scores: torch.Tensor, k: int, n_blocks: torch.Tensor, heads: int = 1) -> torch.Tensor:
    """The reference: ``oasis_core.scoring.topk_blocks`` with each request's block count repeated over its heads."""
    from oasis_core.scoring import topk_blocks

    return topk_blocks(scores.float(), k, n_blocks.long().repeat_interleave(heads))


def bench_topk_select(batch=44, heads=8, context=16384, block_size=16, k=128, num_warps=4, seed=0):
    """GB/s over the scores read (float32, one row per (request, KV head)) against the 4.3 TB/s roofline; the
    kernel is latency-bound, so ``ms`` (one launch of every row of a layer) is the figure to read."""
    from triton.testing import do_bench

    g = torch.Generator(device="cuda").manual_seed(seed)
    n = context // block_size
    s = torch.randn(batch * heads, n, device="cuda", generator=g)
    nb = torch.full((batch,), n, dtype=torch.int32, device="cuda")
    out = torch.empty(batch * heads, k, dtype=torch.int64, device="cuda")
    fn = lambda: topk_select(s, k, nb, heads, out=out, num_warps=num_warps)  # noqa: E731
    fn()
    equal = bool(torch.equal(out, topk_select_ref(s, k, nb, heads)))
    ms = do_bench(fn, warmup=25, rep=200)
    nbytes = s.numel() * 4
    gbps = nbytes / ms / 1e6
    return dict(
        kernel="topk_select",
        batch=batch,
        context=context,
        k=k,
        num_warps=num_warps,
        ms=ms,
        bytes=nbytes,
        gbps=gbps,
        roofline_gbps=HBM_ROOFLINE_GBPS,
        frac_roofline=gbps / HBM_ROOFLINE_GBPS,
        equal_to_reference=equal,
    )
