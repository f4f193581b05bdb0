"""The per-token block scorer (issue 38, ``tokens``): a few key channels of every token, scored per token, normalised
per query head.

Why. On Gemma 3 270M's full layers at 32K the two-vector scorers (``oasis_core.block_scorers``) hold 57–74% of the
next query's attention in their top 12.5% of blocks, the best K blocks 85% (experiments/block_scorers/README.md).
Two things lose it, and exact per-token scores show which: ranking blocks by the true ``q . k`` of every token but
pooling a KV head's query heads by a plain log-sum-exp still holds only 75%; normalising each query head first
(its softmax over the blocks, then the group's sum: exactly the measured mass) holds 85%. So a scorer needs
(1) per-token resolution, a block's mass being a sum over its tokens, not one vector's alignment, and (2) each head
normalised, since Gemma's query heads differ by orders of magnitude in how peaked they are.

What it stores. Per token and KV head, ``r`` values ``k @ basis`` (``basis`` [Hkv, D, r], fitted offline on real
text that is not an evaluation text; ``r`` = D / 4 costs 2 r bytes a token in bf16 = twice the min/max summaries'
2 D / 16, the issue's ceiling). The bases committed (``experiments/block_scorers/calib/gemma3_270m_basis.npz``,
``smollm2_135m_basis.npz``) select RoPE channel pairs (``i``, ``i + D / 2``): a
pair's energy does not change under RoPE, so channels chosen on any positions serve every position (a PCA basis
mixes pairs of different frequencies and fits only the positions it was fitted on); the pairs are ranked by
``E[q_i^2] E[k_i^2]`` (Double Sparsity's label channels, kept pairwise).

The score of block ``n`` for KV head ``h`` (query heads ``g`` of its group, ``c`` the softmax scale):
``s_g(n) = log sum_{t in n} exp(c (q_g @ basis) . (k_t @ basis))`` (the block's estimated unnormalised mass), then
``log sum_g exp(s_g(n) - L_g)`` with ``L_g = log sum_n exp(s_g(n))`` over the valid blocks (the group's summed
estimated softmax mass). ``sink``: block 0 scores ``+inf`` (as ``+sink``). Tokens at or past ``n_tokens`` do not
count; a block with none scores ``-inf``.

In the engine (``--block-score tokens``, ``ExecConfig.token_rank`` / ``token_basis``): the channel ids of a fitted
pair basis, stored per token by ``oasis_exec.kv.token_summaries`` in place of the min/max summaries and scored by
``oasis_kernels.token_scorer`` (every eligible block complete: ``n_tokens`` = their tokens).

Array-namespace code (numpy or torch, CPU or CUDA), no host synchronisation: tests/unit/test_token_scorer.py.
"""

from __future__ import annotations

import math

from .scoring import num_blocks
from .xp import namespace

NAME = "tokens"


def bytes_per_token(rank: int, dtype_bytes: int = 2) -> int:
    """GPU bytes per token and KV head: ``rank`` stored values (min/max: ``2 D / block_size`` values)."""
    return rank * dtype_bytes


def engine_rank(head_dim: int, rank: int = 0) -> int:
    """The channels a token keeps in the engine (``token_rank``; 0: ``head_dim / 4``, twice the min/max summaries'
    bytes at block 16). Even (RoPE pairs), at most ``head_dim``."""
    r = rank or head_dim // 4
    if r < 2 or r % 2 or r > head_dim:
        raise ValueError(f"token_rank: must be even, in [2, head_dim={head_dim}], got {r}")
    return r


def geometry_rank(block_score: str, head_dim: int, token_rank: int = 0) -> int:
    """``KVGeometry.token_rank`` of a run: the engine rank with ``block_score=tokens``, else 0 (two vectors a block)."""
    return engine_rank(head_dim, token_rank) if block_score == NAME else 0


def first_pairs(n_kv_heads: int, head_dim: int, rank: int):
    """Channel ids [Hkv, r] int32 of the first ``r / 2`` RoPE pairs ``(i, i + D / 2)`` of every head: the basis of a
    model without a fitted one (dummy weights: any ``r`` channels cost and score alike)."""
    import numpy as np

    half = np.arange(rank // 2, dtype=np.int32)
    return np.tile(np.concatenate([half, half + head_dim // 2])[None], (n_kv_heads, 1))


def channel_basis(channels, head_dim: int, dtype):
    """One-hot basis [Hkv, D, r] of channel indices [Hkv, r] (numpy)."""
    import numpy as np

    ch = np.asarray(channels)
    basis = np.zeros((ch.shape[0], head_dim, ch.shape[1]), dtype=dtype)
    for h in range(ch.shape[0]):
        basis[h, ch[h], np.arange(ch.shape[1])] = 1
    return basis


def build(keys, basis, block_size: int):
    """Projected keys per block: keys [..., Hkv, T, D], basis [Hkv, D, r] -> [..., Hkv, N, block_size, r] (the
    partial last block padded with zeros; ``score``'s ``n_tokens`` masks them)."""
    if block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {block_size}")
    xp = namespace(keys, basis)
    *lead, t, _ = keys.shape
    r = basis.shape[-1]
    n = num_blocks(t, block_size)
    kp = keys @ basis  # [..., Hkv, T, r]
    pad = n * block_size - t
    if pad:
        kp = xp.concat([kp, xp.zeros((*lead, pad, r), kp.dtype, like=kp)], axis=-2)
    return kp.reshape(*lead, n, block_size, r)


def score(q, kp, basis, n_tokens, scale: float | None = None, sink: bool = True):
    """Scores [B, Hkv, N]. q: [B, Hq, D]; kp: [B, Hkv, N, bs, r] (``build``'s); basis [Hkv, D, r]; n_tokens int [B]
    (the tokens that count; later ones and empty blocks -> ``-inf``); ``scale`` default ``1 / sqrt(D)``."""
    bsz, hq, d = q.shape
    _, hkv, n, bs, r = kp.shape
    if hq % hkv:
        raise ValueError(f"q: {hq} query heads are not a multiple of {hkv} KV heads")
    xp = namespace(q, kp, basis)
    c = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qp = q.reshape(bsz, hkv, hq // hkv, d) @ basis[None]  # [B, Hkv, G, r]
    s = c * (qp @ xp.swapaxes(kp.reshape(bsz, hkv, n * bs, r), -1, -2))  # [B, Hkv, G, N * bs]
    tok = xp.arange(n * bs, like=s)
    valid = tok[None, :] < xp.asarray(n_tokens, like=s)[:, None]  # [B, N * bs]
    ninf = xp.full((), -math.inf, s.dtype, like=s)
    s = xp.where(valid[:, None, None, :], s, ninf).reshape(bsz, hkv, hq // hkv, n, bs)
    s = _lse(xp, s, -1)  # [B, Hkv, G, N]
    norm = _lse(xp, s, -1)  # [B, Hkv, G]: -inf only without a valid token
    norm = xp.where(norm == xp.full((), -math.inf, s.dtype, like=s), xp.zeros((), s.dtype, like=s), norm)
    s = s - norm[..., None]  # each query head's log-softmax over the blocks
    out = _lse(xp, s, 2)  # [B, Hkv, N]
    if sink:
        first = (xp.arange(n, like=out) == 0)[None, None, :] & (xp.asarray(n_tokens, like=out) > 0)[:, None, None]
        out = xp.where(first, xp.full((), math.inf, out.dtype, like=out), out)
    return out


def _lse(xp, x, axis: int):
    """log-sum-exp over ``axis``; ``-inf`` where every entry is ``-inf``."""
    m = xp.amax(x, axis=axis)
    ninf = xp.full((), -math.inf, x.dtype, like=x)
    safe = xp.where(m == ninf, xp.zeros((), x.dtype, like=x), m)
    return safe + xp.log(xp.sum(xp.exp(x - _expand(safe, axis)), axis=axis))


def _expand(x, axis: int):
    if axis == -1:
        return x[..., None]
    if axis == 2:
        return x[:, :, None]
    raise ValueError(f"axis {axis}: only -1 and 2")
