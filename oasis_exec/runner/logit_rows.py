"""``LogitRows``: a step's logits a request, made when read (``Runner.last_logits`` / ``last_logits_seq``).

A step keeps, for each request, the logits its tokens were sampled from (the server's log-probabilities read them).
Building that dict eagerly cost a tensor view a request and step (two in a speculative step: the last row and the
emitted rows), 0.1-0.6 ms of host time at 64 requests while the GPU waits for the next step; most steps nobody reads
them. This mapping keeps the step's logits tensor and each request's row index and makes the view on access.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


class LogitRows(Mapping):
    """``req_id -> row(i)``, ``i`` the request's index in ``req_ids`` (the step's rows in order); ``row`` makes the
    tensor (a view of the step's logits) when it is read."""

    def __init__(self, req_ids, row: Callable):
        self._index = {rid: i for i, rid in enumerate(req_ids)}
        self._row = row

    def __getitem__(self, rid):
        return self._row(self._index[rid])

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)
