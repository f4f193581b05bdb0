"""Remote partial fetching (RPF): what crosses the network when prefill and decode run on different nodes.

At hand-off the prefill node sends only (1) the blocks the first decode step predicts, (2) the block summaries of
the whole context, (3) the draft model's KV state (and the newest, always-resident block); every later miss is
fetched from the prefill node's host pool, under the same fetch cap as local transfers.

Units. The network moves *units* of one (layer, KV head, block): K and V of ``block_size`` tokens, the same
slice the sparse policy selects per head (``KVGeometry.bytes_per_block_head`` bytes). A unit is *selected* when
a step's predicted set (hand-off) or needed set (decode) names it.

Hand-off granularity (``handoff_blocks``, ``RemoteLedger.handoff``):

- ``"block"`` (default, as in the paper's "union over heads"): per layer, the union over the KV heads of their
  predicted blocks; a block in the union is sent for *every* KV head of that layer (one contiguous chunk per
  block and layer in a paged layout), and counts as selected for every head.
- ``"head"``: each head's own predicted blocks only (fewest bytes, many small chunks).

Invariants the ledger enforces (``RPFError`` on violation): a unit crosses the network at most once, and only a
unit that was selected. Blocks with ids ``>= n_blocks`` (created by decoding on the decode node) never cross.

This module is host-side bookkeeping on numpy arrays (one ledger per request); it is not a decode-step GPU path.
Torch tensors are accepted and copied to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Tuple, Union

import numpy as np

from .echo import show

GRANULARITIES = ("block", "head")


class RPFError(AssertionError):
    """An RPF invariant was broken: a unit sent twice, or a unit sent that was never selected."""


def _host(x) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: must be one of {GRANULARITIES}, got {show(granularity)}")


def handoff_blocks(pred) -> Union[np.ndarray, Tuple[np.ndarray, ...]]:
    """Blocks sent at hand-off at block granularity: the union over KV heads of the predicted blocks.

    pred: int [H, K] (one layer) or [L, H, K], block ids, -1 padded.
    Returns, for [H, K], the sorted unique ids (int64 [U]); for [L, H, K], a tuple of L such arrays (per layer).
    """
    p = _host(pred)
    if p.ndim not in (2, 3):
        raise ValueError(f"handoff_blocks: pred must be [H, K] or [L, H, K], got shape {p.shape}")
    if p.ndim == 2:
        return np.unique(p[p >= 0]).astype(np.int64)
    return tuple(np.unique(layer[layer >= 0]).astype(np.int64) for layer in p)


@dataclass(frozen=True)
class HandoffBytes:
    """Bytes of one request's hand-off, by kind; ``full_kv`` is what a dense hand-off would send."""

    blocks: int  # K+V of the predicted units
    local: int  # K+V of the newest (always-resident) block, every layer and head
    summaries: int  # min/max key summaries of every block, every layer and head
    draft_state: int  # the draft model's KV state
    full_kv: int  # K+V of every block, every layer and head

    @property
    def total(self) -> int:
        return self.blocks + self.local + self.summaries + self.draft_state

    @property
    def reduction(self) -> float:
        """``full_kv / total``: how many times less the partial hand-off sends (the paper: 6.5x at 24K)."""
        return self.full_kv / self.total if self.total else float("inf")


def handoff_bytes(
    units: int,
    *,
    n_blocks: int,
    layers: int,
    kv_heads: int,
    kv_bytes_per_block_head: int,
    summary_bytes_per_block_head: int,
    draft_state_bytes: int = 0,
    local_blocks: int = 1,
) -> HandoffBytes:
    """Bytes of a partial hand-off.

    units: (layer, KV head, block) units of predicted blocks sent (``RemoteLedger.handoff`` returns it; at block
        granularity it is ``kv_heads * sum(len(u) for u in handoff_blocks(pred))``).
    n_blocks: blocks of the prompt's context (summaries cover all of them; the newest ``local_blocks`` of them are
        sent as well, in every layer and head).
    kv_bytes_per_block_head, summary_bytes_per_block_head: ``KVGeometry.bytes_per_block_head`` and
        ``KVGeometry.summary_bytes_per_block_head``.
    draft_state_bytes: the draft model's KV state (0 if the draft shares the target's KV).
    """
    for name, v in (
        ("units", units),
        ("n_blocks", n_blocks),
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("kv_bytes_per_block_head", kv_bytes_per_block_head),
        ("summary_bytes_per_block_head", summary_bytes_per_block_head),
        ("draft_state_bytes", draft_state_bytes),
        ("local_blocks", local_blocks),
    ):
        if isinstance(v, bool) or not isinstance(v, Integral) or v < 0:
            raise ValueError(f"handoff_bytes.{name}: must be an integer >= 0, got {show(v)}")
    rows = layers * kv_heads
    if units > rows * n_blocks:
        raise ValueError(f"handoff_bytes.units: at most layers*kv_heads*n_blocks = {rows * n_blocks}, got {units}")
    return HandoffBytes(
        blocks=units * kv_bytes_per_block_head,
        local=min(local_blocks, n_blocks) * rows * kv_bytes_per_block_head,
        summaries=n_blocks * rows * summary_bytes_per_block_head,
        draft_state=draft_state_bytes,
        full_kv=n_blocks * rows * kv_bytes_per_block_head,
    )


@dataclass(frozen=True)
class RemoteFetch:
    """One decode step's remote fetches of a request (host numpy arrays).

    blocks: int64 [L, H, C] block ids fetched over the network now, in the order given, -1 padded.
    n_fetch: int64 [L, H] units fetched now (``<= cap``).
    n_missing: int64 [L, H] needed units not yet local (fetched now or deferred by the cap).
    bytes: network bytes of this step (``n_fetch.sum() * kv_bytes_per_block_head``).
    """

    blocks: np.ndarray
    n_fetch: np.ndarray
    n_missing: np.ndarray
    bytes: int


class RemoteLedger:
    """Per request: which (layer, KV head, block) units are selected and which have crossed the network.

    layers, kv_heads: the request's row layout; n_blocks: blocks of the prompt held by the prefill node (ids
    ``>= n_blocks`` are produced by decoding and are local); kv_bytes_per_block_head: bytes of one unit.
    """

    def __init__(self, layers: int, kv_heads: int, n_blocks: int, kv_bytes_per_block_head: int):
        for name, v in (
            ("layers", layers),
            ("kv_heads", kv_heads),
            ("n_blocks", n_blocks),
            ("kv_bytes_per_block_head", kv_bytes_per_block_head),
        ):
            if isinstance(v, bool) or not isinstance(v, Integral) or v < 1:
                raise ValueError(f"RemoteLedger.{name}: must be an integer >= 1, got {show(v)}")
        self.layers, self.kv_heads, self.n_blocks = layers, kv_heads, n_blocks
        self.unit_bytes = kv_bytes_per_block_head
        self.selected = np.zeros((layers, kv_heads, n_blocks), dtype=bool)
        self.sent = np.zeros((layers, kv_heads, n_blocks), dtype=bool)
        self.handed_off = False
        self.handoff_units = 0
        self.decode_units = 0

    # -- accounting ----------------------------------------------------------------------------------------------
    @property
    def units_sent(self) -> int:
        return self.handoff_units + self.decode_units

    @property
    def handoff_kv_bytes(self) -> int:
        return self.handoff_units * self.unit_bytes

    @property
    def decode_bytes(self) -> int:
        return self.decode_units * self.unit_bytes

    @property
    def kv_bytes(self) -> int:
        """All K+V bytes that crossed the network for this request (hand-off and decode)."""
        return self.units_sent * self.unit_bytes

    # -- the invariant gate ------------------------------------------------------------------------------------
    def select(self, mask: np.ndarray) -> None:
        """Mark the units in bool ``mask`` [L, H, N] as selected."""
        self.selected |= mask

    def record(self, mask: np.ndarray) -> int:
        """Send the units in bool ``mask`` [L, H, N]; raises ``RPFError`` if one was already sent or never selected.
        Returns the number of units sent."""
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != self.sent.shape:
            raise ValueError(f"RemoteLedger.record: mask must have shape {self.sent.shape}, got {mask.shape}")
        twice = mask & self.sent
        if twice.any():
            l, h, b = np.argwhere(twice)[0]
            raise RPFError(f"unit (layer {l}, head {h}, block {b}) would cross the network a second time")
        unselected = mask & ~self.selected
        if unselected.any():
            l, h, b = np.argwhere(unselected)[0]
            raise RPFError(f"unit (layer {l}, head {h}, block {b}) was never selected")
        self.sent |= mask
        return int(mask.sum())

    def check(self) -> None:
        """Assert the invariants on the whole state: everything sent was selected."""
        if (self.sent & ~self.selected).any():
            raise RPFError("a sent unit was never selected")

    # -- hand-off and decode -----------------------------------------------------------------------------------
    def handoff(self, pred, granularity: str = "block", local_blocks: int = 1) -> int:
        """Send the first step's predicted blocks and the newest ``local_blocks`` blocks; returns the predicted
        units sent (the ``units`` argument of ``handoff_bytes``; the local blocks are counted separately there).

        pred: int [L, H, K] block ids, -1 padded, each ``< n_blocks``.
        """
        _check_granularity(granularity)
        if self.handed_off:
            raise RPFError("hand-off already done for this request")
        ids = self._ids(pred)
        mask = np.zeros_like(self.sent)
        li, hi, ki = np.nonzero(ids >= 0)
        mask[li, hi, ids[li, hi, ki]] = True
        if granularity == "block":
            mask |= mask.any(axis=1, keepdims=True)  # union over heads, sent for every head of the layer
        local = np.zeros_like(mask)
        local[:, :, max(self.n_blocks - local_blocks, 0) :] = True
        local &= ~mask  # a predicted block is never also the local one, but do not count it twice
        self.select(mask | local)
        units = self.record(mask)
        self.record(local)
        self.handoff_units += units + int(local.sum())
        self.handed_off = True
        return units

    def request(self, needed, cap=None) -> RemoteFetch:
        """The units to fetch remotely now: needed units not yet local, in the given order, at most ``cap`` per row.

        needed: int [L, H, K] block ids needed by this step (e.g. the predicted set, or a plan's ``fetch_block``),
            -1 padded, distinct per row; ids ``>= n_blocks`` are local (decoded here) and never fetched.
        cap: None (no cap), an int, or int [L, H]. Units beyond the cap stay missing and are asked for again later.
        """
        ids = self._ids(needed, allow_local=True)
        L, H, K = ids.shape
        if cap is None:
            cap_arr = np.full((L, H), K, dtype=np.int64)
        else:
            cap_arr = np.broadcast_to(np.asarray(_host(cap), dtype=np.int64), (L, H))
            if (cap_arr < 0).any():
                raise ValueError(f"RemoteLedger.request: cap must be >= 0, got min {int(cap_arr.min())}")
        remote = (ids >= 0) & (ids < self.n_blocks)
        safe = np.where(remote, ids, 0)
        li, hi = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        li, hi = li[:, :, None], hi[:, :, None]
        miss = remote & ~self.sent[li, hi, safe]
        take = miss & (np.cumsum(miss, axis=-1) <= cap_arr[:, :, None])

        sel = np.zeros_like(self.selected)
        sel[np.broadcast_to(li, ids.shape)[remote], np.broadcast_to(hi, ids.shape)[remote], ids[remote]] = True
        self.select(sel)
        send = np.zeros_like(self.sent)
        send[np.broadcast_to(li, ids.shape)[take], np.broadcast_to(hi, ids.shape)[take], ids[take]] = True
        units = self.record(send)
        self.decode_units += units

        n_fetch = take.sum(axis=-1).astype(np.int64)
        width = int(min(K, cap_arr.max(initial=0)))
        order = np.argsort(~take, axis=-1, kind="stable")[:, :, :width]  # taken entries first, order kept
        blocks = np.where(np.arange(width) < n_fetch[:, :, None], np.take_along_axis(ids, order, axis=-1), -1)
        return RemoteFetch(
            blocks=blocks.astype(np.int64),
            n_fetch=n_fetch,
            n_missing=miss.sum(axis=-1).astype(np.int64),
            bytes=units * self.unit_bytes,
        )

    def _ids(self, x, allow_local: bool = False) -> np.ndarray:
        ids = _host(x).astype(np.int64)
        if ids.ndim != 3 or ids.shape[:2] != (self.layers, self.kv_heads):
            raise ValueError(f"RemoteLedger: block ids must be [{self.layers}, {self.kv_heads}, K], got {ids.shape}")
        if (ids < -1).any():
            raise ValueError(f"RemoteLedger: block ids must be >= 0 or -1, got {int(ids.min())}")
        if not allow_local and (ids >= self.n_blocks).any():
            raise ValueError(f"RemoteLedger: block ids must be < n_blocks = {self.n_blocks}, got {int(ids.max())}")
        s = np.sort(ids, axis=-1)
        if ((s[..., 1:] == s[..., :-1]) & (s[..., 1:] >= 0)).any():
            raise ValueError("RemoteLedger: block ids must be distinct within a row")
        return ids
