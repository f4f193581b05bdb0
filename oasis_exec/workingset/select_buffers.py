"""The selection's device buffers, allocated once (stable addresses for CUDA-graph capture; on CPU too, where tests
force the fused path): the store rows' ids (a slice of rows is a view of them), ``plan_select``'s copy list and
plan fields (one set a layer in the background modes, whose layer's list is read by its transfer until the next
step's ``wait(layer)``; one shared set in the on-demand modes, consumed on the same stream), the membership marks
of rows that hold more blocks than they attend (a hot cache, a victim cache; ``ExecConfig.plan_marks``: O(S + K)
a row instead of S x K compares; one set for the prediction stream's plans, one for ``fetch_now``'s on the main
stream), and a hot cache's attended-slot list."""

from __future__ import annotations

import torch


class SelectBuffers:
    def __init__(self, *, cfg, store, max_cap: int, device):
        from oasis_kernels.plan_select import PlanSelectOut

        n_rows = store.B * store.H
        self.device = device
        self.ids = torch.arange(n_rows, dtype=torch.int64, device=device)
        self._key = self._dev = None

        def bufs():
            n = n_rows * max_cap
            i32 = [torch.full((n,), -1, dtype=torch.int32, device=device) for _ in range(3)]
            i64 = [torch.full((x,), -1, dtype=torch.int64, device=device) for x in (n, n, n_rows, n_rows, n_rows)]
            return PlanSelectOut(*i32, *i64)

        held = store.layers  # a hybrid model's sliding layers plan nothing: no list
        self.lists = [bufs() if l in held else None for l in range(store.L)] if cfg.mode_spec.background else [bufs()]
        self.marks = None
        if cfg.plan_marks and store.S > cfg.top_k:
            self.marks = [torch.zeros(n_rows, store.NB, dtype=torch.int32, device=device) for _ in range(2)]
        self.slot_buf = None
        if cfg.mode_spec.hot_cache:
            self.slot_buf = torch.full((n_rows * cfg.top_k,), -1, dtype=torch.int32, device=device)

    def row_ids(self, rows):
        """The rows (store rows ``lane * H + h``) as an int64 device tensor: a view of the row ids for a slice (no
        kernel), else the index converted once per step (the runner passes the same object to every layer)."""
        if isinstance(rows, slice):
            return self.ids[rows]
        if rows is not self._key:
            r = rows.pin_memory() if rows.device.type == "cpu" and self.device.type == "cuda" else rows
            self._key, self._dev = rows, r.to(self.device, torch.int64, non_blocking=True)
        return self._dev
