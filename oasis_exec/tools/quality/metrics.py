"""Set and attention-mass metrics of the selection harness (torch, any device). Sets are int64 [..., K] block ids,
best first, -1 padded (``oasis_core.scoring.topk_blocks``'s output); every function returns per-row values so the
caller can pool them however it reports (per layer, per head, per text)."""

from __future__ import annotations

import torch


def set_overlap(a, b):
    """|a ∩ b| / |b| per row: a, b [..., K] (ids >= 0 valid, -1 = none); float [...] (0 where b is empty)."""
    hit = (a[..., :, None] == b[..., None, :]) & (a[..., :, None] >= 0)  # [..., Ka, Kb]
    n_hit = hit.any(-2).sum(-1).float()
    n_b = (b >= 0).sum(-1).float()
    return torch.where(n_b > 0, n_hit / n_b.clamp(min=1), torch.zeros_like(n_hit))


def head_pair_overlap(sets):
    """Mean over the pairs of KV heads of ``set_overlap``: sets [..., H, K] -> float [...] (1.0 for one head)."""
    h = sets.shape[-2]
    if h < 2:
        return torch.ones(sets.shape[:-2], device=sets.device)
    pairs = [(i, j) for i in range(h) for j in range(i + 1, h)]
    return torch.stack([set_overlap(sets[..., i, :], sets[..., j, :]) for i, j in pairs], -1).mean(-1)


def attention_probs(q, k, n_valid):
    """Softmax attention of queries over a causal prefix, fp32. q: [P, Hq, D]; k: [T, Hkv, D]; n_valid: int64 [P]
    (row p attends keys ``0 .. n_valid[p] - 1``). Returns [P, Hq, T] (zeros beyond ``n_valid``)."""
    p_, hq, d = q.shape
    t, hk, _ = k.shape
    s = torch.einsum("phgd,thd->phgt", q.float().view(p_, hk, hq // hk, d), k.float()) / d**0.5
    valid = torch.arange(t, device=q.device)[None, :] < n_valid[:, None]  # [P, T]
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    return torch.softmax(s, -1).reshape(p_, hq, t)


def block_mass(probs, block_size: int, kv_heads: int):
    """Attention mass per block and KV head: probs [P, Hq, T] -> [P, Hkv, ceil(T / block_size)], the mean over each
    KV head's query heads of the summed probabilities of the block's tokens (each row sums to 1 per KV head)."""
    p_, hq, t = probs.shape
    nb = -(-t // block_size)
    pad = nb * block_size - t
    if pad:
        probs = torch.cat([probs, probs.new_zeros(p_, hq, pad)], -1)
    per_block = probs.view(p_, hq, nb, block_size).sum(-1)
    return per_block.view(p_, kv_heads, hq // kv_heads, nb).mean(2)


def captured_mass(mass, ids, local_block):
    """Mass in the resident set (the blocks ``ids`` plus the local block): mass [P, H, NB], ids [P, H, K]
    (-1 = none), local_block int64 [P] -> float [P, H]."""
    p_, h, nb = mass.shape
    picked = torch.zeros(p_, h, nb + 1, dtype=torch.bool, device=mass.device)  # column nb absorbs the padding
    picked.scatter_(-1, torch.where(ids >= 0, ids, nb), True)
    picked.scatter_(-1, local_block[:, None, None].expand(-1, h, 1), True)
    return (mass * picked[..., :nb]).sum(-1)


def new_blocks(history, sets):
    """Blocks of ``sets`` [R, K] never in ``history`` (bool [R, NB + 1], the last column absorbing -1; updated in
    place): int64 [R]."""
    ids = torch.where(sets >= 0, sets, history.shape[-1] - 1)
    fresh = (~history.gather(-1, ids)) & (sets >= 0)
    history.scatter_(-1, ids, True)
    return fresh.sum(-1)


def entering_ranks(prev, cur):
    """Rank fractions ``(rank + 0.5) / K`` in ``cur`` [R, K] (best first) of its blocks not in ``prev`` [R, K]:
    (sum of fractions [R], count [R]) so callers can pool."""
    k = cur.shape[-1]
    entering = ~((cur[..., :, None] == prev[..., None, :]).any(-1)) & (cur >= 0)
    frac = (torch.arange(k, device=cur.device, dtype=torch.float32) + 0.5) / k
    return (entering * frac).sum(-1), entering.sum(-1)
