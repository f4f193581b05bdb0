"""The slots a row's attention reads when it holds more blocks than it attends (a victim cache, ``S > K``), in one
launch: ``oasis_core.selection.attend_slots`` as absolute slot ids.

A background mode (lookahead, proxy) with ``ExecConfig.hot_slots = S > top_k`` keeps blocks the prediction dropped
resident until they are the least recently selected, so a block that comes back is a hit, not a fetch. Attention
then reads the ``K`` most recently selected resident slots of each row: the kept and admitted blocks of the last plan
and, where the cap left some predicted blocks out, the most recently selected of the others.

Layout:

- ``resident``, ``last_sel``: ``[N, S]`` integer, a layer's tables (``SparseStore.resident[l]`` / ``last_sel[l]``);
- ``rows``: ``[R]`` integer, the store rows to list (``lane * H + h``), in the attention's batch order;
- returns ``[R, K]`` int32: ``rows[r] * W + s`` for each chosen slot ``s`` in ascending slot order, -1 padded where
  a row holds fewer than ``K`` blocks (``W``: the store's slots a row, local and trash slots included).

Per program (one row): each resident slot gets the key ``(last_sel, slot)`` packed into a non-negative int64
(last_sel clamped below at ``-2**40``, which a step-relative table reaches after 2**40 steps), the K-th largest key
is found bit by bit (61 counts over the row), and the chosen slots are packed in slot order by a cumsum. A row
whose newest ``last_sel`` is held by exactly ``min(K, resident)`` slots (the victim cache's usual row: every
predicted block resident after the plan) takes those without the search.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._util import check, next_pow2
from .topk_select import kth_largest

LS_FLOOR = -(2**40)  # last_sel below this ties with it (the kernel's key has 40 bits of last_sel)


@triton.jit
def attend_slots_kernel(
    RES, LS, ROWS, OUT, S, W, stride_res, stride_ls, K: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr
):
    r = tl.program_id(0)
    row = tl.load(ROWS + r).to(tl.int64)
    offs = tl.arange(0, BLOCK_S)
    ok = offs < S
    res = tl.load(RES + row * stride_res + offs, mask=ok, other=-1)
    ls = tl.load(LS + row * stride_ls + offs, mask=ok, other=0).to(tl.int64)
    valid = ok & (res >= 0)
    lsc = tl.maximum(ls, -(2**40))
    key = tl.where(valid, ((lsc + 2**40) << 20) | offs.to(tl.int64), -1)  # distinct, < 2**61 where valid
    need = tl.minimum(tl.sum(valid.to(tl.int32), axis=0), K)
    # The common row: exactly `need` slots share the newest last_sel (the last plan's kept and admitted blocks, all
    # of the prediction resident): those, no search.
    top = tl.max(tl.where(valid, lsc, -(2**41)), axis=0)
    newest = valid & (lsc == top)
    if tl.sum(newest.to(tl.int32), axis=0) == need:
        sel = newest
    else:
        t = kth_largest(key, need, 60)  # the need-th largest key
        sel = valid & (key >= t) & (need > 0)
    pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(OUT + r * K + pos, (row * W + offs).to(tl.int32), mask=sel)
    offs_k = tl.arange(0, BLOCK_K)
    tl.store(OUT + r * K + offs_k, tl.full(offs_k.shape, -1, tl.int32), mask=(offs_k < K) & (offs_k >= need))


def attend_slots(resident: torch.Tensor, last_sel: torch.Tensor, rows: torch.Tensor, k: int, W: int, out=None):
    """Absolute slot ids [R, k] int32 of the ``k`` slots each of ``rows`` attends (module docstring); one launch,
    no host sync."""
    N, S = resident.shape
    R = rows.shape[0]
    assert 1 <= k <= S, f"k: must be in [1, S={S}], got {k}"
    check(last_sel, "last_sel", (N, S), None, resident.device)
    check(rows, "rows", (R,), None, resident.device)
    assert S < 2**20, f"S ({S}) must be < 2**20"
    if out is None:
        out = torch.empty((R, k), dtype=torch.int32, device=resident.device)
    check(out, "out", (R, k), torch.int32, resident.device)
    if R == 0:
        return out
    attend_slots_kernel[(R,)](
        resident,
        last_sel,
        rows,
        out,
        S,
        W,
        resident.stride(0),
        last_sel.stride(0),
        K=k,
        BLOCK_S=next_pow2(S),
        BLOCK_K=next_pow2(k),
    )
    return out


def attend_slots_ref(resident: torch.Tensor, last_sel: torch.Tensor, rows: torch.Tensor, k: int, W: int):
    """The reference: ``oasis_core.selection.attend_slots`` of the rows' tables, offset to absolute slots."""
    from oasis_core.selection import attend_slots as core

    rows = rows.long()
    a = core(resident[rows], last_sel[rows].clamp(min=LS_FLOOR), k)
    return torch.where(a >= 0, rows[:, None] * W + a, -1).to(torch.int32)
