"""The hot-cache family (hisparse, arXiv 2608.07009): a resident set of ``hot_slots >= K`` slots a row, evicted
least recently used, of which attention reads only the step's top-K.

Each layer predicts its top-K from the step's own query and fetches the misses on the main stream before it attends
(``Prefetcher.fetch_now``); the attended slots are the slot of each predicted block after the fetch
(``plan_select``'s ``slots_out`` on CUDA, ``SparseStore.selected_slots`` otherwise). Everything else is the
resident family's.
"""

from __future__ import annotations

from .resident import ResidentSet


class HotCacheSet(ResidentSet):
    family = "hot_cache"

    def _step_slots(self, l, s, r, q):
        if r.slot_ids_all is not None:  # an all-short step: every block of the lane is in its slots
            return r.slot_ids_all
        pred = self._own_prediction(l, s, q)
        hot_ids = self.p.pipe.fetch_now(l, pred, s.lanes, s.rows, slots=True)
        if hot_ids is not None:
            return hot_ids.view(s.B, self.p.H, -1)
        return self.p.store.selected_slots(l, s.rows, pred, r.base)
