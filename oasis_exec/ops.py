"""Dispatch to the Triton kernels on CUDA and to their torch references elsewhere (CPU tests)."""

from __future__ import annotations

import torch


def _cuda(t) -> bool:
    return t.device.type == "cuda"


def sparse_attn(q, k_slots, v_slots, slot_ids, local_slot, local_len, extra_k=None, extra_v=None):
    """q [B, Hq, Tq, D]; see oasis_kernels.sparse_attn. Returns out [B, Hq, Tq, D]."""
    if _cuda(q):
        from oasis_kernels.sparse_attn import sparse_attn as k

        return k(q, k_slots, v_slots, slot_ids, local_slot, local_len, extra_k, extra_v)
    from oasis_kernels.sparse_attn import sparse_attn_ref

    return sparse_attn_ref(q, k_slots, v_slots, slot_ids, local_slot, local_len, extra_k, extra_v)[0]


def paged_attn(q, k_cache, v_cache, block_table, seq_lens):
    if _cuda(q):
        from oasis_kernels.paged_attn import paged_attn as k

        return k(q, k_cache, v_cache, block_table, seq_lens)
    from oasis_kernels.paged_attn import paged_attn_ref

    out = paged_attn_ref(q, k_cache, v_cache, block_table, seq_lens)
    return out[0] if isinstance(out, tuple) else out


def block_score(q, kmin, kmax, n_blocks, seat=None, scorer: str = "minmax"):
    """Scores [B, Hkv, Nmax] fp32, -inf where not eligible (local block and beyond). ``scorer``
    (``oasis_core.block_scorers``; ``ExecConfig.block_score``): ``kmin`` / ``kmax`` hold that scorer's summaries."""
    if scorer != "minmax":
        from oasis_kernels import block_scorers as bsc

        return (bsc.block_score_any if _cuda(q) else bsc.block_score_any_ref)(q, kmin, kmax, n_blocks, scorer, seat)
    if _cuda(q):
        from oasis_kernels.block_score import block_score as k

        return k(q, kmin, kmax, n_blocks, seat)
    from oasis_kernels.block_score import block_score_ref

    return block_score_ref(q, kmin, kmax, n_blocks, seat)


def token_score(q, kp, chan, n_blocks, seat=None):
    """``block_score=tokens``: scores [B, Hkv, Nmax] fp32 from every token's kept channels ``kp``
    [n_seats, Hkv, Nmax, bs, r] (``oasis_kernels.token_scorer``), -inf at the local block and beyond."""
    from oasis_kernels import token_scorer as ts

    return (ts.token_score if _cuda(q) else ts.token_score_ref)(q, kp, chan, n_blocks, seat)


def token_update(k_src, src, dst_row, dst_block, n_valid, kp, chan):
    """``block_score=tokens``: each item's block's kept channels into ``kp`` (``summary_update``'s items)."""
    from oasis_kernels import token_scorer as ts

    return (ts.token_update if _cuda(k_src) else ts.token_update_ref)(k_src, src, dst_row, dst_block, n_valid, kp, chan)


def topk_select(scores, k, n_blocks, heads):
    """Top-``k`` block ids [R, k] of ``scores`` [R, N], rows ``b * heads + h`` of request ``b`` with ``n_blocks[b]``
    blocks (``oasis_core.scoring.topk_blocks``'s ids)."""
    if _cuda(scores):
        from oasis_kernels.topk_select import topk_select as k_

        return k_(scores, k, n_blocks, heads)
    from oasis_kernels.topk_select import topk_select_ref

    return topk_select_ref(scores, k, n_blocks, heads)


def attend_slots(resident, last_sel, rows, k, W):
    """Absolute slot ids [R, k] int32 of the ``k`` most recently selected resident slots of each of ``rows`` (a
    victim cache's attended set: ``oasis_kernels.attend_slots``, ``oasis_core.selection.attend_slots``)."""
    if _cuda(resident):
        from oasis_kernels.attend_slots import attend_slots as k_

        return k_(resident, last_sel, rows, k, W)
    from oasis_kernels.attend_slots import attend_slots_ref

    return attend_slots_ref(resident, last_sel, rows, k, W)


def summary_update(k_src, src, dst_row, dst_block, n_valid, kmin, kmax, scorer: str = "minmax"):
    """Each item's block summarised for ``scorer`` into ``kmin`` / ``kmax`` (its two summary vectors)."""
    if scorer != "minmax":
        from oasis_core.block_scorers import get_scorer

        if _cuda(k_src):
            from oasis_kernels import block_scorers as bsc

            return bsc.summary_update_any(k_src, src, dst_row, dst_block, n_valid, kmin, kmax, scorer)
        if get_scorer(scorer).summary != "minmax":  # vectorised torch equivalent of bsc.summary_moments_ref
            ok = (src >= 0) & (n_valid > 0)
            src, row, blk, nv = src[ok].long(), dst_row[ok].long(), dst_block[ok].long(), n_valid[ok].long()
            keys = k_src[src].float()  # [M, bs, D]
            valid = (torch.arange(keys.shape[1], device=keys.device) < nv[:, None])[:, :, None]
            cnt = nv[:, None].float()
            mean = keys.masked_fill(~valid, 0.0).sum(1) / cnt
            second = mean
            if get_scorer(scorer).summary == "meanstd":
                second = ((keys - mean[:, None]).masked_fill(~valid, 0.0).pow(2).sum(1) / cnt).sqrt()
            kmin[row, blk] = mean.to(kmin.dtype)
            kmax[row, blk] = second.to(kmax.dtype)
            return
    if _cuda(k_src):
        from oasis_kernels.summary_update import summary_update as k

        return k(k_src, src, dst_row, dst_block, n_valid, kmin, kmax)
    # Vectorised torch equivalent of oasis_kernels.summary_update_ref (whose per-item loop is too slow for long tests).
    ok = (src >= 0) & (n_valid > 0)
    if not bool(ok.any()):
        return
    src, dst_row, dst_block, n_valid = src[ok].long(), dst_row[ok].long(), dst_block[ok].long(), n_valid[ok].long()
    keys = k_src[src].float()  # [M, bs, D]
    valid = (torch.arange(keys.shape[1]) < n_valid[:, None])[:, :, None]
    kmin[dst_row, dst_block] = keys.masked_fill(~valid, float("inf")).amin(1).to(kmin.dtype)
    kmax[dst_row, dst_block] = keys.masked_fill(~valid, float("-inf")).amax(1).to(kmax.dtype)


def block_summaries(kb, scorer: str = "minmax"):
    """Summaries of whole blocks for ``scorer``: kb [..., n, bs, D] -> (a, b), each [..., n, D] (fp32 math, no sync)."""
    if scorer == "minmax":
        return kb.amin(-2), kb.amax(-2)
    from oasis_core.block_scorers import build

    *lead, n, bs, d = kb.shape
    a, b = build(kb.float().reshape(*lead, n * bs, d), bs, scorer)
    return a.to(kb.dtype), b.to(kb.dtype)


def write_block_summaries(store, l, lane: int, lo: int, kb, scorer: str) -> None:
    """Whole blocks ``lo ..`` of ``lane`` in layer ``l`` summarised from their keys ``kb`` [H, n, bs, D] (prefill):
    the two vectors of ``scorer`` into ``kmin`` / ``kmax``, or the per-token scorer's channels (``store.tok``)."""
    if store.tok is not None:
        return store.tok.write_blocks(l, lane, lo, kb)
    a, b = block_summaries(kb, scorer)
    store.kmin[l, lane, :, lo : lo + kb.shape[1]] = a
    store.kmax[l, lane, :, lo : lo + kb.shape[1]] = b


def ring_attn(q, k_ring, v_ring, lanes, qpos, window: int):
    """A sliding layer's decode attention over its ring (``oasis_kernels.ring_attn``; ``RingKV.attend``): q [B, nq, Hq,
    D] at positions ``qpos`` [B, nq] over ``k_ring`` / ``v_ring`` [max_lanes, H, R, D] rows ``lanes`` -> [B, nq, Hq, D].
    The kernel on CUDA where its tiles fit the head dim (a power of two >= 16), else the torch reference."""
    d = q.shape[-1]
    if _cuda(q) and d >= 16 and not d & (d - 1):
        from oasis_kernels.ring_attn import ring_attn as k

        return k(q, k_ring, v_ring, lanes, qpos, window)
    from oasis_kernels.ring_attn import ring_attn_ref

    return ring_attn_ref(q, k_ring, v_ring, lanes, qpos, window)


def kv_write(k_new, v_new, k_cache, v_cache, row, off, fused: bool = True):
    """The step's K/V into ``cache[row, off]`` (``oasis_kernels.kv_write``): one launch on CUDA when ``fused``, else the
    plain-torch assignment (``oasis_kernels.kv_write_ref`` without its -1 skip: the runner's rows are all live)."""
    if fused and _cuda(k_new):
        from oasis_kernels.kv_write import kv_write as k

        return k(k_new, v_new, k_cache, v_cache, row, off)
    B, H = k_new.shape[:2]  # plain advanced indexing, no host sync (every row is live here)
    r, o = row.long().view(B, H), off.long()[:, None]
    k_cache[r, o] = k_new
    v_cache[r, o] = v_new


def i32(x):
    return x.to(torch.int32)
