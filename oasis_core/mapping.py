"""Per-head mapping: GPU slot -> host logical block, per (request, layer, KV head) row.

``HeadMapping`` is host-side numpy bookkeeping. The executor keeps a torch mirror of ``table`` and ``last_sel`` on
the GPU and applies the same ``StepPlan``s to it; the simulator uses this one directly. A selection change rewrites
entries of this table (and the slot contents), never the paged pool's own page tables.

Rows are handed out per request in contiguous ranges of ``n_layers * n_kv_heads`` rows, ordered layer-major:
row ``start + layer * n_kv_heads + head``. Invariants, checked by ``check()``: within a row no host block sits in
two slots (a bijection between occupied slots and the row's resident blocks); a row holds at most ``budget[row]``
blocks; free rows are all empty.
"""

from __future__ import annotations

import numpy as np

from .echo import show


class MappingError(ValueError):
    """Misuse of a ``HeadMapping`` (double allocate, unknown request, out of capacity, bad plan)."""


class HeadMapping:
    """Slot tables for up to ``max_requests`` requests.

    table: int64 [max_requests * n_layers * n_kv_heads, slots], host block id per slot, -1 = free.
    last_sel: int64, same shape, last step the slot's block was selected (-1 = never), the LRU key of eviction.
    budget: int64 [rows], most occupied slots a row may hold (``slots`` unless lowered at allocation).
    """

    def __init__(self, max_requests: int, n_layers: int, n_kv_heads: int, slots: int):
        for name, v in (
            ("max_requests", max_requests),
            ("n_layers", n_layers),
            ("n_kv_heads", n_kv_heads),
            ("slots", slots),
        ):
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise MappingError(f"HeadMapping.{name}: must be an int >= 1, got {show(v)}")
        self.max_requests = int(max_requests)
        self.n_layers = int(n_layers)
        self.n_kv_heads = int(n_kv_heads)
        self.slots = int(slots)
        n_rows = self.max_requests * self.rows_per_request
        self.table = np.full((n_rows, self.slots), -1, dtype=np.int64)
        self.last_sel = np.full((n_rows, self.slots), -1, dtype=np.int64)
        self.budget = np.full(n_rows, self.slots, dtype=np.int64)
        self._free = list(range(self.max_requests - 1, -1, -1))  # request chunks; pop() takes the lowest
        self._chunk_of: dict = {}

    @property
    def rows_per_request(self) -> int:
        return self.n_layers * self.n_kv_heads

    @property
    def n_rows(self) -> int:
        return self.table.shape[0]

    @property
    def n_free(self) -> int:
        """Requests that can still be allocated."""
        return len(self._free)

    def allocate(self, request_id, budget: int | None = None) -> range:
        """Give ``request_id`` its rows (all slots empty) and return them as a ``range``.

        budget: slots the request's rows may fill (default ``slots``; 0..slots).
        """
        if request_id in self._chunk_of:
            raise MappingError(f"allocate: request {show(request_id)} already holds rows {self.rows(request_id)}")
        if not self._free:
            raise MappingError(
                f"allocate: request {show(request_id)}: out of capacity, all {self.max_requests} "
                f"request row ranges are in use"
            )
        b = self.slots if budget is None else budget
        if not isinstance(b, (int, np.integer)) or not 0 <= b <= self.slots:
            raise MappingError(f"allocate: budget must be an int in [0, {self.slots}], got {show(budget)}")
        chunk = self._free.pop()
        self._chunk_of[request_id] = chunk
        rows = self.rows(request_id)
        self.table[rows.start : rows.stop] = -1
        self.last_sel[rows.start : rows.stop] = -1
        self.budget[rows.start : rows.stop] = b
        return rows

    def release(self, request_id) -> range:
        """Free the request's rows (slots emptied); returns the rows it held."""
        rows = self.rows(request_id)
        self.table[rows.start : rows.stop] = -1
        self.last_sel[rows.start : rows.stop] = -1
        self.budget[rows.start : rows.stop] = self.slots
        self._free.append(self._chunk_of.pop(request_id))
        self._free.sort(reverse=True)
        return rows

    def rows(self, request_id) -> range:
        """Rows of an allocated request."""
        try:
            chunk = self._chunk_of[request_id]
        except KeyError:
            raise MappingError(f"unknown request {show(request_id)} (not allocated or already released)") from None
        start = chunk * self.rows_per_request
        return range(start, start + self.rows_per_request)

    def row(self, request_id, layer: int, head: int) -> int:
        """The row of one (request, layer, KV head)."""
        if not (0 <= layer < self.n_layers and 0 <= head < self.n_kv_heads):
            raise MappingError(
                f"row: layer {layer} / head {head} out of range ({self.n_layers} layers, {self.n_kv_heads} KV heads)"
            )
        return self.rows(request_id).start + layer * self.n_kv_heads + head

    def allocated_rows(self) -> np.ndarray:
        """All rows currently held by some request, ascending."""
        chunks = np.sort(np.fromiter(self._chunk_of.values(), dtype=np.int64, count=len(self._chunk_of)))
        per = self.rows_per_request
        return (chunks[:, None] * per + np.arange(per, dtype=np.int64)[None, :]).reshape(-1)

    def apply(self, plan, rows=None) -> None:
        """Write ``plan.fetch_block`` into ``plan.fetch_slot`` of ``rows`` and take ``plan.last_sel``.

        rows: mapping rows of the plan's rows (a ``range``, int array or slice; default all rows). The plan must
        have been computed from this table's current contents: the result must equal ``plan.resident``.
        Accepts numpy plans (torch plans are converted: host-side bookkeeping only).
        """
        fb, fs, res, ls = (_host(a) for a in (plan.fetch_block, plan.fetch_slot, plan.resident, plan.last_sel))
        idx = np.arange(self.n_rows) if rows is None else np.arange(self.n_rows)[rows]
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if idx.shape[0] != fb.shape[0]:
            raise MappingError(f"apply: plan has {fb.shape[0]} rows, {idx.shape[0]} mapping rows given")
        held = np.zeros(self.n_rows, dtype=bool)
        held[self.allocated_rows()] = True
        if not held[idx].all():
            raise MappingError(f"apply: rows {idx[~held[idx]][:8].tolist()} are not allocated to any request")
        if ((fs >= self.slots) | (fs < -1)).any() or ((fs >= 0) != (fb >= 0)).any():
            raise MappingError("apply: fetch_slot out of range or not paired with fetch_block")
        table = self.table[idx]
        r_i, c_i = np.nonzero(fs >= 0)
        table[r_i, fs[r_i, c_i]] = fb[r_i, c_i]
        if not np.array_equal(table, res):
            bad = np.nonzero((table != res).any(axis=1))[0][:8]
            raise MappingError(f"apply: plan was computed from a different table (plan rows {bad.tolist()} differ)")
        self.table[idx] = table
        self.last_sel[idx] = ls

    def lookup(self, rows, host_blocks) -> np.ndarray:
        """Slot holding each host block, -1 if not resident. rows: int array [M]; host_blocks: int array [M]."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        hb = np.asarray(host_blocks, dtype=np.int64).reshape(-1)
        hit = (self.table[rows] == hb[:, None]) & (hb[:, None] >= 0)
        return np.where(hit.any(axis=1), hit.argmax(axis=1), -1)

    def occupancy(self) -> np.ndarray:
        """Occupied slots per row, int64 [n_rows]."""
        return (self.table >= 0).sum(axis=1)

    def check(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant."""
        t = self.table
        assert t.shape == self.last_sel.shape, "table and last_sel shapes differ"
        assert (t >= -1).all(), "table holds ids below -1"
        occ = self.occupancy()
        over = np.nonzero(occ > self.budget)[0]
        assert over.size == 0, f"row {over[0]} holds {occ[over[0]]} blocks, budget {self.budget[over[0]]}"
        # Distinct occupied entries per row: sort, compare neighbours, ignore -1.
        st = np.sort(t, axis=1)
        dup = (st[:, 1:] == st[:, :-1]) & (st[:, 1:] >= 0)
        bad = np.nonzero(dup.any(axis=1))[0]
        assert bad.size == 0, f"row {bad[0]} holds host block {st[bad[0], 1:][dup[bad[0]]][0]} in two slots"
        held = np.zeros(self.n_rows, dtype=bool)
        held[self.allocated_rows()] = True
        stray = np.nonzero(~held & (occ > 0))[0]
        assert stray.size == 0, f"free row {stray[0]} holds blocks"


def _host(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    if type(a).__module__.startswith("torch"):
        return a.detach().cpu().numpy()
    return np.asarray(a)
