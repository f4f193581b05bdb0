"""Lookahead scoring: per-block key summaries, the Quest upper bound, and top-K block selection.

A block of ``block_size`` consecutive tokens is summarised, per KV head, by the coordinate-wise minimum and maximum
of its keys. For a query ``q`` the block's score is the upper bound ``sum_i max(q_i * kmax_i, q_i * kmin_i)`` of
``max_t q . k_t`` over the block's tokens. Since ``kmax_i >= kmin_i``, each term is ``q_i * kmax_i`` when
``q_i >= 0`` and ``q_i * kmin_i`` otherwise, so the score is one matmul: ``relu(q) . kmax + min(q, 0) . kmin``.

All functions are array-namespace code (numpy or torch, CPU or CUDA) with shapes fixed by their inputs: no host
synchronisation on the torch path. Empty (not yet written) summary entries hold ``kmin = +inf``, ``kmax = -inf``;
their scores are meaningless (may be NaN) and ``topk_blocks`` never returns them as long as ``n_blocks`` says so.
"""

from __future__ import annotations

import math

from .xp import namespace


def num_blocks(n_tokens: int, block_size: int) -> int:
    """Blocks covering ``n_tokens`` tokens, the partial last block included."""
    return -(-n_tokens // block_size)


def blocks_of(keys, block_size: int, fill: float):
    """keys [..., T, D] as ``(blocks, pad)``: blocks [..., N, block_size, D] with ``N = ceil(T / block_size)``, the
    partial last block's ``pad = N * block_size - T`` missing rows filled with ``fill`` (chosen so that they never
    count: +inf under a minimum, 0 under a sum)."""
    if block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {block_size}")
    xp = namespace(keys)
    *lead, t, d = keys.shape
    n = num_blocks(t, block_size)
    pad = n * block_size - t
    if pad:
        keys = xp.concat([keys, xp.full((*lead, pad, d), fill, keys.dtype, like=keys)], axis=-2)
    return keys.reshape(*lead, n, block_size, d), pad


def build_summaries(keys, block_size: int):
    """Summaries of a whole context.

    keys: [..., T, D]. Returns ``(kmin, kmax)``, each [..., N, D] with ``N = ceil(T / block_size)``; the partial
    last block is summarised over its valid tokens only.
    """
    xp = namespace(keys)
    # Pad with +inf for the minimum and -inf for the maximum so padding never wins.
    kmin = xp.amin(blocks_of(keys, block_size, math.inf)[0], axis=-2)
    kmax = xp.amax(blocks_of(keys, block_size, -math.inf)[0], axis=-2)
    return kmin, kmax


def empty_summaries(lead_shape, n_blocks: int, head_dim: int, dtype, like=None):
    """Preallocated summaries for ``n_blocks`` blocks: ``kmin = +inf``, ``kmax = -inf`` (nothing folded in yet).

    ``like`` picks the library and device (a numpy array or a torch tensor); ``dtype`` must belong to it.
    """
    xp = namespace(like)
    shape = (*tuple(lead_shape), n_blocks, head_dim)
    return xp.full(shape, math.inf, dtype, like=like), xp.full(shape, -math.inf, dtype, like=like)


def update_summary(kmin, kmax, keys_block, block_idx):
    """Fold new keys into one block's summary; returns new ``(kmin, kmax)`` (inputs are not modified).

    kmin, kmax: [..., N, D]. keys_block: [..., t, D], 1 <= t <= block_size: keys of block ``block_idx`` written
    now (one appended token, or the whole block when it fills). block_idx: a Python int (same block for every
    leading index) or an integer array whose shape is a prefix of the leading shape (e.g. [B] for one block per
    request of [B, Hkv, N, D] summaries).

    The entry at ``block_idx`` must be empty (+inf / -inf) or a summary of a subset of the same block's keys;
    folding is then exact, and folding the same keys twice is harmless. With an int ``block_idx == N`` the
    summaries grow by one block (host-side bookkeeping; the executor preallocates with ``empty_summaries``).
    """
    xp = namespace(kmin, kmax, keys_block)
    *lead, n, d = kmin.shape
    new_min = xp.amin(keys_block, axis=-2)  # [..., D]
    new_max = xp.amax(keys_block, axis=-2)
    if isinstance(block_idx, int):
        if not 0 <= block_idx <= n:
            raise ValueError(f"block_idx: must be in [0, {n}], got {block_idx}")
        if block_idx == n:
            return (
                xp.concat([kmin, new_min[..., None, :]], axis=-2),
                xp.concat([kmax, new_max[..., None, :]], axis=-2),
            )
        idx = xp.full((*lead, 1, d), block_idx, xp.int64, like=kmin)
    else:
        bi = xp.astype(xp.asarray(block_idx, like=kmin), xp.int64)
        if tuple(bi.shape) != tuple(lead[: bi.ndim]):
            raise ValueError(f"block_idx: shape {tuple(bi.shape)} must be a prefix of the leading shape {tuple(lead)}")
        bi = bi.reshape(*bi.shape, *([1] * (len(lead) - bi.ndim)), 1, 1)
        idx = bi + xp.zeros((*lead, 1, d), xp.int64, like=kmin)
    cur_min = xp.take_along(kmin, idx, axis=-2)
    cur_max = xp.take_along(kmax, idx, axis=-2)
    kmin = xp.scatter(kmin, kmin.ndim - 2, idx, xp.minimum(cur_min, new_min[..., None, :]))
    kmax = xp.scatter(kmax, kmax.ndim - 2, idx, xp.maximum(cur_max, new_max[..., None, :]))
    return kmin, kmax


def score_blocks(q, kmin, kmax):
    """Upper-bound score of every block for every KV head.

    q: [B, Hq, D]; kmin, kmax: [B, Hkv, N, D] with ``Hq % Hkv == 0``. Query heads ``g*G .. g*G+G-1``
    (``G = Hq // Hkv``) share KV head ``g`` (HF ``repeat_kv`` order). Returns [B, Hkv, N]: for each KV head the
    maximum over its query heads of ``sum_i max(q_i * kmax_i, q_i * kmin_i)``.
    """
    b, hq, d = q.shape
    hkv = kmin.shape[1]
    if hq % hkv:
        raise ValueError(f"q: {hq} query heads are not a multiple of {hkv} KV heads")
    xp = namespace(q, kmin, kmax)
    g = hq // hkv
    qg = q.reshape(b, hkv, g, d)
    q_pos = xp.where(qg > 0, qg, 0 * qg)
    q_neg = xp.where(qg < 0, qg, 0 * qg)
    # [B, Hkv, G, D] @ [B, Hkv, D, N] -> [B, Hkv, G, N]
    s = q_pos @ xp.swapaxes(kmax, -1, -2) + q_neg @ xp.swapaxes(kmin, -1, -2)
    return xp.amax(s, axis=2)


def topk_blocks(scores, k: int, n_blocks):
    """Top-``k`` block ids per row, best first.

    scores: [R, N]; n_blocks: int or integer array [R] (blocks of each row's context, the partial last block
    included). Block ``n_blocks - 1`` (the newest, always resident as the local block) and blocks ``>= n_blocks``
    are never chosen. Ties go to the lower block id. Returns int64 [R, k] padded with -1 where a row has fewer
    than ``k`` eligible blocks. Eligible scores must not be NaN.
    """
    xp = namespace(scores, n_blocks)
    r, n = scores.shape
    if k < 0:
        raise ValueError(f"k: must be >= 0, got {k}")
    if k > n:  # pad columns so the output keeps its [R, k] shape
        scores = xp.concat([scores, xp.full((r, k - n), -math.inf, scores.dtype, like=scores)], axis=1)
        n = k
    if isinstance(n_blocks, int):
        n_blocks = xp.full((r,), n_blocks, xp.int64, like=scores)
    n_blocks = xp.astype(xp.asarray(n_blocks, like=scores), xp.int64)
    eligible = xp.arange(n, like=scores)[None, :] < (n_blocks[:, None] - 1)  # [R, N]
    masked = xp.where(eligible, scores, xp.full((), -math.inf, scores.dtype, like=scores))
    # Stable descending sort: equal scores keep ascending block order. Eligible ids form a prefix [0, n_blocks-1),
    # so even eligible -inf scores sort ahead of the masked ones.
    ids = xp.argsort_desc(masked, axis=1)[:, :k]
    ok = xp.take_along(eligible, ids, axis=1)
    return xp.where(ok, ids, xp.full((), -1, xp.int64, like=scores))
