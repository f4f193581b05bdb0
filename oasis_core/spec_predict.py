"""Speculation and lookahead pipelined (issue 40): the next step's prediction launched *beside* the verify pass, from
the query of the position the next step will most likely start at, and an exact repair after the acceptance.

A speculative lookahead step of a lane at position ``p`` verifies ``k`` drafts (pass query ``j`` at position
``p + j``, ``j = 0 .. k``) and accepts ``n`` of them; the next step starts at ``p + n + 1`` and the *after* variant
(``spec_predict = "after"``) predicts its top-K, once the acceptance is known, from the pass's query
``query_index(n, k) = min(n + 1, k)`` over the blocks full at ``p + n + 1`` (``n_blocks = (p + n + 1) // bs + 1``,
the local block excluded). Its prediction, selection and copies then wait for the pass.

The *beside* variant (``spec_predict = "beside"``) runs them during the pass, layer by layer, as the ordinary step
does:

- **beside the pass**, per layer: the top-K ``P_s`` of every query index ``s = 1 .. k`` over the blocks full at
  ``p + 1`` (all the pass can see: the blocks a run of accepted drafts fills get their summaries in the commit),
  with their scores; the plan (Algorithm 2, the step's cap) and the copies of ``P_hat = P_{s*}``, ``s*`` the index
  the lane's acceptance estimate makes most likely (``choose_query``: the largest ``P(query_index(n, k) = s)``
  under the lane's per-position acceptance rates; ``k = 1``: always 1).
- **after the acceptance** (the *repair*), per layer: the true prediction ``P_true`` is ``P_{query_index(n, k)}``
  with, where the run filled a block (``fills``: at most one, ``k < bs``), that block merged in by its score
  (``merge_block``: the top-K of the eligible blocks plus one, from the top-K of the others and the new block's
  score; scores are per block, so this is the top-K a full rescoring gives, ties to the lower block as
  ``topk_blocks``). The repair prediction ``repair_pred(P_true, P_hat, resident)`` is ``P_true`` without the blocks
  of ``P_hat`` the beside plan left out (its cap): a second Algorithm-2 plan on the rows, with the same cap, keeps
  ``P_true``'s resident blocks (most recently selected now) and fetches only what the true prediction adds over the
  chosen one. A lane whose ``P_true == P_hat`` (``needs_repair`` false) fetches nothing in it.

**Exactness.** Where ``needs_repair`` is false the beside plan is the after variant's plan, slot for slot (the
repair plan keeps the same blocks and only reorders recency monotonically). Otherwise, after the repair a block of
``P_true`` is missing from the working set only if the beside plan's cap left it out (it is in ``P_hat``) or the
repair's cap did: with an unlimited cap the working set holds ``P_true`` exactly as the after variant's does (the
same blocks, possibly in other slots). The repair fetches at most the cap a row again, so a repaired step may move
up to twice the cap's blocks. Greedy outputs equal non-speculative greedy decoding wherever the after variant's do
(the top-K covering every block; tests/integration/test_exec_spec_pipeline.py).

Array-namespace code (``oasis_core.xp``): numpy in the simulator and tests, torch on the executor's device, no host
synchronisation; ``choose_query`` runs on the host (the estimates live there) but takes arrays alike.
"""

from __future__ import annotations

from .xp import namespace

SPEC_PREDICT = ("after", "beside")


def query_index(n, k: int):
    """The pass's query index nearest the next step's position ``p + n + 1``: ``min(n + 1, k)`` (int64, ``n`` the
    accepted drafts, [B])."""
    xp = namespace(n)
    n = xp.astype(n, xp.int64)
    return xp.minimum(n + 1, xp.full((), k, xp.int64, like=n))


def query_probs(rates, k: int):
    """``P(query_index(n, k) = s)`` for ``s = 1 .. k``, float64 [B, k], of rows of per-position acceptance rates
    ``rates`` [B, >= k] (``rates[:, j]``: P(draft ``j + 1`` accepted | drafts ``1 .. j`` accepted)): index ``s < k``
    is used when exactly ``s - 1`` drafts are accepted, index ``k`` when ``k - 1`` or ``k`` are."""
    xp = namespace(rates)
    r = xp.astype(rates, xp.float64)[:, :k]
    b = r.shape[0]
    one = xp.full((b, 1), 1.0, xp.float64, like=r)
    # reach[:, j] = P(drafts 1 .. j accepted), j = 0 .. k - 1
    reach = xp.concat([one, _cumprod(xp, r[:, : k - 1])], axis=1) if k > 1 else one
    if k == 1:
        return one
    exact = reach[:, : k - 1] * (1.0 - r[:, : k - 1])  # P(n = j), j = 0 .. k - 2
    return xp.concat([exact, reach[:, k - 1 :]], axis=1)


def _cumprod(xp, x):
    """Running product along the last axis (exp of a log-sum would not be exact at 0)."""
    cols = [x[:, :1]]
    for j in range(1, x.shape[1]):
        cols.append(cols[-1] * x[:, j : j + 1])
    return xp.concat(cols, axis=1)


def choose_query(rates, k: int):
    """The query index ``s*`` in ``1 .. k`` the beside prediction uses, int64 [B]: the most likely
    ``query_index(n, k)`` under ``rates`` [B, >= k] (``query_probs``); ties to the lower index."""
    xp = namespace(rates)
    p = query_probs(rates, k)
    return xp.argsort_desc(p, axis=1)[:, 0] + 1


def fills(pos, n, block_size: int):
    """Whether a run of ``n`` accepted drafts after position ``pos`` fills a block the pass could not score: the
    next position's block ``(pos + n + 1) // bs`` lies past ``(pos + 1) // bs``. bool [B]."""
    xp = namespace(pos, n)
    pos = xp.astype(pos, xp.int64)
    n = xp.astype(xp.asarray(n, like=pos), xp.int64)
    return (pos + n + 1) // block_size > (pos + 1) // block_size


def needs_repair(pos, n, s_hat, k: int, block_size: int):
    """Whether a lane's true prediction may differ from the beside one: the accepted ``n`` picks another query
    index than ``s_hat``, or the run filled a block. bool [B]."""
    xp = namespace(pos, n, s_hat)
    s_hat = xp.astype(xp.asarray(s_hat, like=n), xp.int64)
    return (query_index(n, k) != s_hat) | fills(pos, n, block_size)


def repair_possible(pos, ks, s_hat, k: int, block_size: int):
    """Whether a lane's repair can fetch anything, decided before the step from what the host knows (bool [B]): some
    acceptance ``n`` in ``0 .. ks`` picks another query index than ``s_hat``, or a run of ``ks`` drafts could fill a
    block (``(pos + 1) % bs + ks >= bs``). Where no lane of a step can, its repair is skipped (``k = 1``: only the
    lanes one token short of a block's end)."""
    xp = namespace(pos, ks, s_hat)
    pos = xp.astype(pos, xp.int64)
    ks = xp.astype(xp.asarray(ks, like=pos), xp.int64)
    s_hat = xp.astype(xp.asarray(s_hat, like=pos), xp.int64)
    kk = xp.full((), k, xp.int64, like=pos)
    lo, hi = xp.minimum(0 * ks + 1, kk), xp.minimum(ks + 1, kk)  # the query indices n = 0 .. ks reach
    moves = (lo != s_hat) | (hi != s_hat)
    return moves | ((pos + 1) % block_size + ks >= block_size)


def merge_block(ids, vals, new_id, new_val, add):
    """The top-K after one more eligible block: ``ids`` [R, K] (best first, -1 padded) and their scores ``vals``
    [R, K]; rows with ``add`` [R] get block ``new_id`` [R] of score ``new_val`` [R] inserted after every entry
    scored at least as high (it is the highest block id: ``topk_blocks``'s ties go to the lower id), the last entry
    dropped when the row was full. Returns (ids, vals), [R, K]."""
    xp = namespace(ids, vals, new_id, new_val, add)
    ids = xp.astype(ids, xp.int64)
    r, kk = ids.shape
    valid = ids >= 0
    at = xp.sum(xp.astype(valid & (vals >= new_val[:, None]), xp.int64), axis=1)  # [R] insertion column
    at = xp.where(add, at, xp.full((), kk, xp.int64, like=ids))  # K: nothing inserted
    col = xp.arange(kk, like=ids)[None, :]
    prev = xp.maximum(col - 1, xp.full((), 0, xp.int64, like=ids))
    prev = prev + 0 * ids  # [R, K]
    shifted_i = xp.take_along(ids, prev, axis=1)
    shifted_v = xp.take_along(vals, prev, axis=1)
    before, here = col < at[:, None], col == at[:, None]
    new_i = xp.where(before, ids, xp.where(here, xp.astype(new_id, xp.int64)[:, None], shifted_i))
    new_v = xp.where(before, vals, xp.where(here, new_val[:, None], shifted_v))
    return new_i, new_v


def repair_pred(p_true, p_hat, resident):
    """The repair plan's prediction, int64 [R, K]: ``p_true`` without the blocks of ``p_hat`` that are not in
    ``resident`` [R, S] (the beside plan's cap left them out: not the misprediction's), the rest in ``p_true``'s
    order, -1 padded at the end. A plan of it keeps ``p_true``'s resident blocks and fetches, under the cap, only
    what ``p_true`` adds over ``p_hat``."""
    xp = namespace(p_true, p_hat, resident)
    p_true = xp.astype(p_true, xp.int64)
    p_hat = xp.astype(xp.asarray(p_hat, like=p_true), xp.int64)
    resident = xp.astype(xp.asarray(resident, like=p_true), xp.int64)
    drop = (p_true >= 0) & _in_rows(xp, p_true, p_hat) & ~_in_rows(xp, p_true, resident)
    out = xp.where(drop, xp.full((), -1, xp.int64, like=p_true), p_true)
    order = xp.argsort_asc(xp.astype(out < 0, xp.int64), axis=1)  # stable: kept entries first, in order
    return xp.take_along(out, order, axis=1)


def _in_rows(xp, values, pool):
    """``values[r, i] in pool[r, :]``, bool [R, V], by one broadcast compare (no sort: a few kernels on the device,
    where the repair runs after the pass)."""
    return xp.any(values[:, :, None] == pool[:, None, :], axis=2)


def repair_probability(rates, k: int, block_size: int, s_hat=None) -> float:
    """Expected share of a lane's speculative steps that need a repair (host floats; the simulator's model):
    ``1 - P(query_index(n, k) = s*) · P(no fill | n)``, the position within its block uniform (a run of ``n`` fills
    a block from ``n`` of the ``bs`` offsets). ``rates``: one lane's per-position rates (a sequence of >= k floats);
    ``s_hat``: the chosen index (default ``choose_query``'s)."""
    import numpy as np

    r = np.asarray([list(rates)[:k]], dtype=np.float64)
    if s_hat is None:
        s_hat = int(choose_query(r, k)[0])
    reach, p_n = 1.0, []
    for j in range(k + 1):
        p_n.append(reach * (1.0 - r[0, j]) if j < k else reach)
        if j < k:
            reach *= r[0, j]
    ok = sum(p * (1.0 - n / block_size) for n, p in enumerate(p_n) if min(n + 1, k) == s_hat)
    return float(min(1.0, max(0.0, 1.0 - ok)))
