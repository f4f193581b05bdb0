"""Chrome trace format (``timeline.json``, opens in Perfetto / chrome://tracing) of the first steps of a run.

Tracks (``tid``) of the decode GPU (``pid`` 1): 1 compute stream (one slice per layer), 2 side stream (predict +
select per layer), 3 host→GPU copy path (transfer per layer), 4 steps (one slice per step with its batch and bytes).
Times are microseconds of simulated time. ``exec_timeline(recording)``: the same tracks (and 5, the host gather) of a
measured executor run, so the predicted and the measured timeline of one recording open side by side (``replay``).
"""

from __future__ import annotations

import json

from oasis_core.recording import Recording

_TRACKS = {1: "compute", 2: "side stream (predict+select)", 3: "h2d copy", 4: "steps"}


def _slice(name, tid, t0, dur, us_per_unit: float, args=None) -> dict:
    """A complete event (``ph`` X) on the decode GPU (pid 1): start ``t0`` and duration ``dur`` (negative: 0) in a
    unit of ``us_per_unit`` microseconds."""
    ev = {
        "name": name,
        "ph": "X",
        "pid": 1,
        "tid": tid,
        "ts": round(t0 * us_per_unit, 3),
        "dur": round(max(dur, 0.0) * us_per_unit, 3),
    }
    if args:
        ev["args"] = args
    return ev


class Timeline:
    def __init__(self):
        self.events: list[dict] = []

    def _x(self, name, tid, t0, t1, args=None):
        self.events.append(_slice(name, tid, t0, t1 - t0, 1e6, args))

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


# ----------------------------------------------------------------------------------------------------------------
# Chrome trace of a measured run (an executor recording)

# The simulator's tracks (1 compute, 2 side stream, 3 h2d copy, 4 steps) and 5, the host gather (CPU).
_TRACK_OF = {
    "layers": 1,
    "compute": 1,
    "attn": 1,
    "gemm": 1,
    "stall": 1,
    "pred": 2,
    "select": 2,
    "transfer": 3,
    "host_gather": 5,
}
_EXEC_TRACKS = {**_TRACKS, 5: "host gather (CPU)"}


def exec_timeline(rec: Recording) -> dict:
    """Chrome trace (``{"traceEvents": [...]}``) of the measured run, microseconds.

    With ``results.layer_events``: one slice per recorded (step, layer, stage), at its measured time. Steps: the
    sampled step durations laid end to end on track 4 (exact when every step was kept, ``args.sampled`` names the
    step otherwise). With neither, one slice per stage of the mean step (``stage_ms_per_step``) stacked on its
    track and marked ``"mean": true`` -- a summary, not a measured timeline."""
    r = rec.results
    ev = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"executor (measured) {rec.name}"}}]
    ev += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": n}} for t, n in _EXEC_TRACKS.items()]

    def x(name, tid, t0_ms, dur_ms, args=None):
        ev.append(_slice(name, tid, t0_ms, dur_ms, 1e3, args))

    layer_events = r.get("layer_events") or []
    for step, layer, stage, a, b in layer_events:
        x(f"{stage} L{layer}", _TRACK_OF.get(stage, 1), a, b - a, {"step": step})
    steps = r.get("steps") or []
    t = 0.0
    for s in steps:
        d = 1e3 * s["duration_s"]
        x(f"step {s['step']}", 4, t, d, {"sampled": True} if len(steps) < rec.config["steps"] else None)
        t += d
    if not layer_events and not steps:
        tpot = r.get("step_ms_mean", r.get("tpot_ms_mean", r["tpot_ms_p50"]))
        x("mean step", 4, 0.0, tpot, {"mean": True})
        start = {}
        for stage, ms in sorted(r["stage_ms_per_step"].items()):
            tid = _TRACK_OF.get(stage, 1)
            x(stage, tid, start.get(tid, 0.0), ms, {"mean": True, "ms_per_step": ms})
            start[tid] = start.get(tid, 0.0) + ms
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def write_exec_timeline(rec: Recording, path: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(exec_timeline(rec), separators=(",", ":")))
