"""Chrome trace format (``timeline.json``, opens in Perfetto / chrome://tracing) of the first steps of a run.

Tracks (``tid``) of the decode GPU (``pid`` 1): 1 compute stream (one slice per layer), 2 side stream (predict +
select per layer), 3 host→GPU copy path (transfer per layer), 4 steps (one slice per step with its batch and bytes).
Times are microseconds of simulated time.
"""

from __future__ import annotations

import json

_TRACKS = {1: "compute", 2: "side stream (predict+select)", 3: "h2d copy", 4: "steps"}


class Timeline:
    def __init__(self):
        self.events: list[dict] = []

    def _x(self, name, tid, t0, t1, args=None):
        ev = {
            "name": name,
            "ph": "X",
            "pid": 1,
            "tid": tid,
            "ts": round(t0 * 1e6, 3),
            "dur": round(max(t1 - t0, 0.0) * 1e6, 3),
        }
        if args:
            ev["args"] = args
        self.events.append(ev)

    def add_step(self, step: int, timing, n_decode: int, n_prefill: int, h2d_bytes: float) -> None:
        self._x(
            f"step {step}",
            4,
            timing.start,
            timing.end,
            {
                "decode": n_decode,
                "prefill_tokens": n_prefill,
                "h2d_bytes": round(h2d_bytes),
                "stall_us": round(timing.stall_s * 1e6, 3),
            },
        )
        for l, (a, b) in enumerate(timing.compute):
            self._x(f"L{l}", 1, a, b)
        for l, (a, b) in enumerate(timing.side):
            if b > a:
                self._x(f"pred+sel L{l}", 2, a, b)
        for l, (a, b) in enumerate(timing.xfer):
            if b > a:
                self._x(f"xfer L{l}", 3, a, b)

    def add_flow(self, name: str, t0: float, t1: float, nbytes: float) -> None:
        """A network transfer (hand-off or remote fetch) on the NIC track (pid 2)."""
        self.events.append(
            {
                "name": name,
                "ph": "X",
                "pid": 2,
                "tid": 1,
                "ts": round(t0 * 1e6, 3),
                "dur": round(max(t1 - t0, 0.0) * 1e6, 3),
                "args": {"bytes": round(nbytes)},
            }
        )

    def to_json(self) -> str:
        meta = [
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "decode GPU"}},
            {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "NIC"}},
        ]
        meta += [
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": n}} for t, n in _TRACKS.items()
        ]
        return json.dumps({"traceEvents": meta + self.events, "displayTimeUnit": "ms"}, separators=(",", ":"))
