"""Incremental selection with capped eviction (paper Algorithm 2), vectorised over rows.

A row is one (request, layer, KV head). Per row, ``resident[r, s]`` is the host block id held in GPU slot ``s``
(-1 = empty), ``last_sel[r, s]`` the last step at which that block was in a predicted set, and ``pred[r, :]`` the
predicted top-K of the next step, best first, -1 padded. The newest (local) block is resident separately and
never appears in ``resident`` or ``pred``. One step:

- ``keep = P ∩ R``: no traffic, their ``last_sel`` becomes ``step``;
- ``missing = P \\ R`` in prediction order;
- ``victims = R \\ P``: empty slots first (lower slot first), then least-recently-selected first (ties: lower slot);
- ``admit = min(|missing|, cap, |victims|)``; ``missing[j]`` goes into slot ``victims[j]`` for ``j < admit``, and
  its ``last_sel`` becomes ``step``. Missing blocks beyond the cap are not fetched this step.

A row may hold more slots than the step attends (``S > K``: a victim cache). Blocks the prediction dropped then stay
resident until they are the least recently selected, so a block that comes back into the set is a hit, not a fetch.
Attention reads ``attend_slots``: the ``K`` most recently selected resident slots, which are the step's kept and
admitted blocks and, where the cap left some out, the most recently selected of the others (with ``S == K``: every
resident slot, the paper's working set).

The code is array-namespace code (``oasis_core.xp``): on torch tensors it never synchronises with the host (no
``.item()``, ``.tolist()``, ``.cpu()``, no Python branch on values) and every output has a shape fixed by the
inputs and ``max_cap``. Preconditions (not checked, to stay sync-free): block ids are ``>= 0`` or -1, distinct
within ``pred[r]`` and within ``resident[r]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any

from .xp import namespace

_EMPTY_FIRST = -(2**62)  # victim key of an empty slot: before every real last_sel
_NOT_VICTIM = 2**62  # victim key of a kept slot: after every real last_sel


@dataclass(frozen=True)
class StepPlan:
    """The transfers of one step and the state after them (arrays of the caller's library and device).

    fetch_block: int64 [R, C] host block ids to copy in, best first, -1 padded (``C = max_cap``).
    fetch_slot: int64 [R, C] slot each of them overwrites, -1 padded (same positions as ``fetch_block``).
    n_fetch: int64 [R] transfers per row (``admit``).
    n_missing: int64 [R] predicted blocks that were not resident (drift this step, fetched or not).
    n_kept: int64 [R] predicted blocks already resident (no traffic).
    resident: int64 [R, S] slot contents after the transfers.
    last_sel: int64 [R, S] last-selected step per slot after the step.
    """

    fetch_block: Any
    fetch_slot: Any
    n_fetch: Any
    n_missing: Any
    n_kept: Any
    resident: Any
    last_sel: Any

    @property
    def rows(self) -> int:
        return self.fetch_block.shape[0]

    @property
    def max_cap(self) -> int:
        return self.fetch_block.shape[1]


def _member(xp, values, pool):
    """``values[r, i] in pool[r, :]`` for integer [R, V] and [R, M] (pads included: mask them after)."""
    table = getattr(xp, "member_rows", None)  # numpy: a membership table when the ids span little
    if table is not None:
        out = table(values, pool)
        if out is not None:
            return out
    sorted_pool = xp.take_along(pool, xp.argsort_asc(pool, axis=1), axis=1)
    m = pool.shape[1]
    if m == 0:
        return xp.zeros(values.shape, xp.bool_, like=values)
    pos = xp.searchsorted_rows(sorted_pool, values)
    pos = xp.minimum(pos, xp.full((), m - 1, xp.int64, like=values))
    return xp.take_along(sorted_pool, pos, axis=1) == values


def _pad_cols(xp, x, width, fill):
    """First ``width`` columns of ``x`` [R, M], padded with ``fill`` when ``M < width``."""
    r, m = x.shape
    if m >= width:
        return x[:, :width]
    return xp.concat([x, xp.full((r, width - m), fill, x.dtype, like=x)], axis=1)


def count_missing(resident, pred):
    """Per row, the predicted blocks not resident (``plan_step``'s ``n_missing``) without planning anything: what an
    adaptive cap policy reads (``CapContext.n_missing``) before it picks the cap of the step. int64 [R], no sync."""
    xp = namespace(resident, pred)
    resident = xp.astype(resident, xp.int64)
    pred = xp.astype(xp.asarray(pred, like=resident), xp.int64)
    return xp.sum(xp.astype((pred >= 0) & ~_member(xp, pred, resident), xp.int64), axis=1)


def plan_step(resident, last_sel, pred, cap, step: int, max_cap: int) -> StepPlan:
    """Plan and apply one step of Algorithm 2 for every row.

    resident, last_sel: integer [R, S]; pred: integer [R, K] (best first, -1 padded); cap: int or integer array
    [R], clipped to ``[0, max_cap]``; step: the step index written into ``last_sel``; max_cap: C, the column count
    of the fetch arrays (``FetchCapPolicy.max_cap(K)``). Inputs are not modified. See ``StepPlan``.
    """
    if max_cap < 0:
        raise ValueError(f"max_cap: must be >= 0, got {max_cap}")
    if isinstance(cap, Integral) and not 0 <= cap <= max_cap:
        raise ValueError(f"cap: must be in [0, max_cap={max_cap}], got {cap}")
    xp = namespace(resident, last_sel, pred)
    resident = xp.astype(resident, xp.int64)
    last_sel = xp.astype(last_sel, xp.int64)
    pred = xp.astype(xp.asarray(pred, like=resident), xp.int64)
    r, s = resident.shape
    if pred.shape[0] != r or last_sel.shape != resident.shape:
        raise ValueError(
            f"shapes: resident {tuple(resident.shape)}, last_sel {tuple(last_sel.shape)}, "
            f"pred {tuple(pred.shape)} must share R and S"
        )
    c = max_cap

    res_valid = resident >= 0
    pred_valid = pred >= 0
    keep = res_valid & _member(xp, resident, pred)  # [R, S]
    missing = pred_valid & ~_member(xp, pred, resident)  # [R, K]

    # Missing blocks, in prediction order, to the front.
    miss_order = xp.argsort_asc(xp.astype(~missing, xp.int64), axis=1)
    miss_blocks = xp.take_along(pred, miss_order, axis=1)
    n_missing = xp.sum(xp.astype(missing, xp.int64), axis=1)

    # Victims: empty slots first, then least recently selected; kept slots last. Stable sort: ties by slot.
    key = xp.where(res_valid, last_sel, xp.full((), _EMPTY_FIRST, xp.int64, like=resident))
    key = xp.where(keep, xp.full((), _NOT_VICTIM, xp.int64, like=resident), key)
    victim_slots = xp.argsort_asc(key, axis=1)
    n_victims = s - xp.sum(xp.astype(keep, xp.int64), axis=1)

    if isinstance(cap, Integral):
        cap_r = xp.full((r,), int(cap), xp.int64, like=resident)
    else:
        cap_r = xp.astype(xp.asarray(cap, like=resident), xp.int64)
        cap_r = xp.minimum(
            xp.maximum(cap_r, xp.full((), 0, xp.int64, like=resident)), xp.full((), c, xp.int64, like=resident)
        )
    admit = xp.minimum(xp.minimum(n_missing, cap_r), n_victims)  # [R]

    col = xp.arange(c, like=resident)[None, :]
    admitted = col < admit[:, None]  # [R, C]
    none = xp.full((), -1, xp.int64, like=resident)
    fetch_block = xp.where(admitted, _pad_cols(xp, miss_blocks, c, -1), none)
    fetch_slot = xp.where(admitted, _pad_cols(xp, victim_slots, c, -1), none)

    # Apply: scatter into an extra dummy column S that absorbs the padding entries.
    target = xp.where(admitted, fetch_slot, xp.full((), s, xp.int64, like=resident))
    pad_col = xp.full((r, 1), -1, xp.int64, like=resident)
    new_resident = xp.scatter(xp.concat([resident, pad_col], axis=1), 1, target, fetch_block)[:, :s]
    now = xp.full((r, c), step, xp.int64, like=resident)
    new_last_sel = xp.where(keep, xp.full((), step, xp.int64, like=resident), last_sel)
    new_last_sel = xp.scatter(xp.concat([new_last_sel, pad_col], axis=1), 1, target, now)[:, :s]

    return StepPlan(
        fetch_block=fetch_block,
        fetch_slot=fetch_slot,
        n_fetch=admit,
        n_missing=n_missing,
        n_kept=xp.sum(xp.astype(keep, xp.int64), axis=1),
        resident=new_resident,
        last_sel=new_last_sel,
    )


def attend_slots(resident, last_sel, k: int):
    """The slots attention reads in a row that holds ``S >= k`` blocks: its ``k`` most recently selected resident
    slots (largest ``last_sel``; ties: the higher slot), listed in ascending slot order, -1 padded where the row
    holds fewer than ``k`` blocks. int64 [R, k]; resident, last_sel: integer [R, S]. After a ``plan_step`` the kept
    and admitted blocks come first (their ``last_sel`` is the step's); with ``S == k`` this is every resident slot.
    No host sync."""
    xp = namespace(resident, last_sel)
    resident = xp.astype(resident, xp.int64)
    last_sel = xp.astype(last_sel, xp.int64)
    r, s = resident.shape
    if not 1 <= k <= s:
        raise ValueError(f"attend_slots: k must be in [1, S={s}], got {k}")
    slot = xp.arange(s, like=resident)[None, :]
    valid = resident >= 0
    # last_sel first, then the slot; an empty slot after every resident one
    key = xp.where(valid, last_sel * s + slot, xp.full((), _EMPTY_FIRST, xp.int64, like=resident))
    top = xp.argsort_desc(key, axis=1)[:, :k]  # [R, k] slot indices, most recent first
    keep = xp.take_along(valid, top, axis=1)
    chosen = xp.where(keep, top, xp.full((), s, xp.int64, like=resident))  # s: a pad that sorts last
    chosen = xp.take_along(chosen, xp.argsort_asc(chosen, axis=1), axis=1)
    return xp.where(chosen < s, chosen, xp.full((), -1, xp.int64, like=resident))


def attended_blocks(resident, last_sel, k: int):
    """The block ids ``attend_slots`` lists (int64 [R, k], -1 padded): what attention reads in each row."""
    xp = namespace(resident, last_sel)
    a = attend_slots(resident, last_sel, k)
    held = xp.take_along(xp.astype(resident, xp.int64), xp.maximum(a, xp.full((), 0, xp.int64, like=a)), axis=1)
    return xp.where(a >= 0, held, xp.full((), -1, xp.int64, like=a))


def initial_plan(pred, step: int = 0, slots: int | None = None) -> StepPlan:
    """First fill at admission: all ``slots`` (default K) empty, every predicted block fetched (cap = C = K).

    pred: integer [R, K], best first, -1 padded. The plan's ``fetch_slot[r, j] == j`` for the fetched blocks.
    """
    xp = namespace(pred)
    r, k = pred.shape
    s = k if slots is None else slots
    empty = xp.full((r, s), -1, xp.int64, like=pred)
    cap = min(k, s)
    return plan_step(empty, xp.full((r, s), -1, xp.int64, like=pred), pred, cap, step, cap)
