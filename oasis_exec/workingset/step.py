"""What every layer of a decode step reads, made once a step (``ModelExec.decode_core`` / ``decode_spec``).

``DecodeStep`` is the mode-independent part (lanes, positions, block counts, the summary / write-back items);
``ResidentRows`` is what a resident working set adds (``ResidentSet.prepare``), ``PagedRows`` a paged one's
verification pass (``PagedSet.prepare_verify``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SHORT_STEPS = ("none", "some", "all")  # decode_core's ``short``: how many of the step's lanes can be short


@dataclass
class DecodeStep:
    """The lanes [B], their rows and positions (``pos`` [B]; ``positions`` [B * nq] of every query row, lane-major),
    the queries a lane (``nq``: 2 with the draft token, ``k + 1`` in a verification pass), the step's drawn or
    replayed sets, block counts now and next step, the local block's valid tokens [B]; the summary / write-back
    items [B * H] (row, block, valid tokens, source slot or page) and the new token's offset in its block; a paged
    step's pages ``page_cur``. ``saved``: a verification pass collects each resident layer's ``{l: (q, draft K, draft
    V)}`` there for ``commit`` (None in an ordinary step)."""

    lanes: torch.Tensor
    rows: object
    pos: torch.Tensor
    positions: torch.Tensor
    nq: int
    all_short: bool
    sets: object
    recorded: object
    hh: torch.Tensor
    lanes32: torch.Tensor
    nb_cur: torch.Tensor
    nb_next: torch.Tensor
    local_len: torch.Tensor
    item_row: torch.Tensor
    item_blk: torch.Tensor
    item_len: torch.Tensor
    item_src: torch.Tensor | None = None
    off32: torch.Tensor | None = None
    page_cur: torch.Tensor | None = None
    saved: dict | None = None

    @property
    def B(self) -> int:
        """Lanes of the step."""
        return self.lanes.shape[0]


def decode_step(lanes, rows, pos, nq, *, block_size, n_kv_heads, all_short=False, sets=None, recorded=None):
    """The ``DecodeStep`` of lanes [B] at positions ``pos`` [B] with ``nq`` query rows a lane (positions
    ``pos .. pos + nq - 1``)."""
    bs, H, dev = block_size, n_kv_heads, lanes.device
    local_len = (pos % bs + 1).to(torch.int32)
    hh = torch.arange(H, device=dev)
    return DecodeStep(
        lanes=lanes,
        rows=rows,
        pos=pos,
        positions=(pos[:, None] + torch.arange(nq, device=dev)).reshape(-1),
        nq=nq,
        all_short=all_short,
        sets=sets,
        recorded=recorded,
        hh=hh,
        lanes32=lanes.to(torch.int32),
        nb_cur=pos // bs + 1,  # blocks of the context incl. the local block (which holds ``pos``)
        nb_next=(pos + 1) // bs + 1,
        local_len=local_len,
        item_row=(lanes[:, None] * H + hh).reshape(-1).to(torch.int32),  # summary / write-back items [B * H]
        item_blk=(pos // bs).repeat_interleave(H).to(torch.int32),
        item_len=local_len.repeat_interleave(H),
    )


def rows_index(lanes_list, H):
    """Rows of the lanes: a slice when they are contiguous (views, no copies), else an index list."""
    lo = lanes_list[0]
    if lanes_list == list(range(lo, lo + len(lanes_list))):
        return slice(lo * H, (lo + len(lanes_list)) * H)
    return torch.tensor([b * H + h for b in lanes_list for h in range(H)])


@dataclass
class ResidentRows:
    """A resident step's per-row tensors: slot bases [B, H], local slots, the selectable slots' offsets [S], the
    write-back's valid lengths and host destinations [B * H]; with short lanes (``short`` "some" / "all") their
    slot tables (``in_order`` [B, S], ``sr``, ``res_short``, ``ls_short``) or, all short, the slots attended in every
    layer (``slot_ids_all``); at a crossing step the crossing lanes (``ci``, ``c_lanes``, ``c_rows``, ``c_items``)."""

    base: torch.Tensor
    local_slot: torch.Tensor
    sel_off: torch.Tensor
    wb_len: torch.Tensor
    item_dst: torch.Tensor | None = None
    in_order: torch.Tensor | None = None
    slot_ids_all: torch.Tensor | None = None
    sr: torch.Tensor | None = None
    res_short: torch.Tensor | None = None
    ls_short: torch.Tensor | None = None
    ci: torch.Tensor | None = None
    c_lanes: torch.Tensor | None = None
    c_rows: torch.Tensor | None = None
    c_items: tuple | None = None


@dataclass
class PagedRows:
    """A paged verification pass's rows: every position's page row and offset [B * nq * H] / [B * nq], the block
    tables repeated a position and each position's context length."""

    rows_all: torch.Tensor
    offs_all: torch.Tensor
    tables: torch.Tensor
    lens: torch.Tensor
