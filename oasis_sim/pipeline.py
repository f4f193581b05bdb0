"""Per-layer decode-step pipeline: compute on the main stream, predict → select → transfer in the background.

One decode step of a batch runs ``head_s`` (embedding, launch), then layers ``0..L-1`` on the compute stream, then
``tail_s`` (LM head, sampling). In background modes (``lookahead``, ``proxy``) the end of layer ``l``'s compute
starts, on a side stream, that layer's prediction (``pred_s``) and selection (``select_s``); the transfer
(``xfer_s``, on the host→GPU copy path, FIFO across layers and steps) follows. **Layer-local sync**: layer ``l`` of
the next step may start only when layer ``l``'s transfer of this step is done; the wait is a stall.

Two implementations give the same floats:

- :meth:`LayerPipeline.step_closed` evaluates the recurrence in closed form (a Python loop over layers, no SimPy
  events): ``start_l = max(t, ready_l)``, ``t = start_l + c_l``; side ``s = max(side_free, t) + pred + sel``;
  transfer ``x0 = max(s, link_free)``, ``ready_l = link_free = x0 + x_l``.
- :meth:`LayerPipeline.step_events` runs the same step as SimPy processes, one per layer stage, holding the compute
  stream, a side stream and the copy path as ``simpy.Resource`` s and waiting on per-layer transfer events.

Both compute every time as *(earlier time) + duration* with the same operands in the same order, so the results are
bit-identical (``tests/unit/test_sim_pipeline.py`` checks it on random steps). The engine uses the closed form and
yields one SimPy event per step, scheduled at the step's absolute end time (:func:`at`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappush
from itertools import accumulate, repeat
from typing import Sequence

import simpy
from simpy.events import NORMAL

from oasis_core.echo import show


def at(env: simpy.Environment, t: float) -> simpy.Event:
    """An event that fires at absolute time ``t`` (>= now), with no rounding from ``now + (t - now)``.

    Uses SimPy 4's event queue layout ``(time, priority, eid, event)``, as ``Environment.schedule`` does.
    """
    if t < env.now:
        raise ValueError(f"at: time {show(t)} is in the past (now {show(env.now)})")
    ev = simpy.Event(env)
    ev._ok = True
    ev._value = None
    heappush(env._queue, (t, NORMAL, next(env._eid), ev))
    return ev


@dataclass
class LayerWork:
    """Durations of one step (seconds). ``compute_s``, ``pred_s``, ``select_s``, ``xfer_s`` are per layer:
    a float for all layers alike or a sequence of length L. ``background`` False: no side work at all."""

    n_layers: int
    head_s: float
    compute_s: float | Sequence[float]
    tail_s: float
    background: bool = False
    pred_s: float | Sequence[float] = 0.0
    select_s: float | Sequence[float] = 0.0
    xfer_s: float | Sequence[float] = 0.0

    def per_layer(self, name: str) -> list[float]:
        v = getattr(self, name)
        if isinstance(v, (int, float)):
            return [float(v)] * self.n_layers
        v = [float(x) for x in v]
        if len(v) != self.n_layers:
            raise ValueError(f"LayerWork.{name}: expected {self.n_layers} values, got {len(v)}")
        return v


@dataclass
class StepTiming:
    start: float
    end: float
    stall_s: float
    # Per-layer records, filled when asked for (timeline): (start, end) of compute, side and transfer stages.
    compute: list[tuple[float, float]] = field(default_factory=list)
    side: list[tuple[float, float]] = field(default_factory=list)
    xfer: list[tuple[float, float]] = field(default_factory=list)


class LayerPipeline:
    """Carries the cross-step state: per-layer transfer completion times, side-stream and link free times."""

    def __init__(self, n_layers: int):
        self.n_layers = n_layers
        self._ready = [0.0] * n_layers  # time layer l's latest transfer completes
        self._lazy = None  # (compute end times, pred, sel, xfer) of a fast-forwarded step: ready not yet built
        self.side_free = 0.0
        self.link_free = 0.0
        self._ready_ev: list[simpy.Event | None] = [None] * n_layers  # event mode only

    @property
    def ready(self) -> list[float]:
        """Per layer, when its latest transfer completes (built on demand after a fast-forwarded step, with the
        operations the loop would have done)."""
        if self._lazy is not None:
            ends, p, s, x = self._lazy
            self._lazy = None
            if x > 0:
                self._ready = [((e + p) + s) + x for e in ends]
            else:
                self._ready = [(e + p) + s for e in ends]
        return self._ready

    # -- closed form ------------------------------------------------------------------------------------------
    def step_closed(self, t0: float, w: LayerWork, record: bool = False) -> StepTiming:
        """The recurrence of the module docstring. Fast path (no records, scalar durations): when every layer's
        previous transfer is done before this step's first layer may start (``max(side_free, link_free) <= t0 +
        head``: no stall is possible) and each layer's side work plus transfer is shorter than a layer's compute
        by more than the rounding of the clock (no queueing on the side stream or the link), the step is
        ``head + L·c + tail`` computed by the same sequential additions as the loop, and ``ready`` is kept as those
        compute end times, to be expanded only if a later step needs it. Bit-identical to the loop and to
        :meth:`step_events` (``tests/unit/test_sim_pipeline.py``)."""
        c = w.compute_s
        if not record and type(c) is float and c > 0.0:
            t = t0 + w.head_s
            sf, lf = self.side_free, self.link_free
            if t >= (sf if sf > lf else lf):
                bg = w.background
                if bg:
                    p, sl, x = w.pred_s, w.select_s, w.xfer_s
                    if type(p) is float and type(sl) is float and type(x) is float:
                        ends = list(accumulate(repeat(c, self.n_layers), initial=t))
                        t_end = ends[-1]
                        margin = 1e-13 * (t_end if t_end > 1.0 else 1.0)
                        if (p + sl) + (x if x > 0 else 0.0) < c - margin:
                            del ends[0]
                            side = (t_end + p) + sl
                            self.side_free = side
                            if x > 0:
                                self.link_free = side + x
                            self._lazy = (ends, p, sl, x)
                            return StepTiming(t0, t_end + w.tail_s, 0.0)
                else:
                    ends = list(accumulate(repeat(c, self.n_layers), initial=t))
                    return StepTiming(t0, ends[-1] + w.tail_s, 0.0)
        c = w.per_layer("compute_s")
        ready = self.ready
        stall = 0.0
        t = t0 + w.head_s
        rec = StepTiming(t0, t0, 0.0)
        if w.background:
            pred, sel, x = w.per_layer("pred_s"), w.per_layer("select_s"), w.per_layer("xfer_s")
            side_free, link_free = self.side_free, self.link_free
            for l in range(self.n_layers):
                r = ready[l]
                start = t if t >= r else r
                stall += start - t
                t = start + c[l]
                s0 = side_free if side_free > t else t
                side_free = (s0 + pred[l]) + sel[l]
                if x[l] > 0:
                    x0 = side_free if side_free > link_free else link_free
                    link_free = x0 + x[l]
                    ready[l] = link_free
                    if record:
                        rec.xfer.append((x0, link_free))
                else:
                    ready[l] = side_free
                    if record:
                        rec.xfer.append((side_free, side_free))
                if record:
                    rec.compute.append((start, t))
                    rec.side.append((s0, side_free))
            self.side_free, self.link_free = side_free, link_free
        else:
            for l in range(self.n_layers):
                r = ready[l]
                start = t if t >= r else r
                stall += start - t
                t = start + c[l]
                if record:
                    rec.compute.append((start, t))
        rec.end = t + w.tail_s
        rec.stall_s = stall
        return rec

    # -- SimPy events (reference implementation) --------------------------------------------------------------
    def step_events(
        self,
        env: simpy.Environment,
        w: LayerWork,
        compute: simpy.Resource,
        side: simpy.Resource,
        link: simpy.Resource,
        out: list,
    ):
        """SimPy process of one step; appends its :class:`StepTiming` (with per-layer records) to ``out``.

        ``side`` and ``link`` must have capacity 1 (one side stream, one copy path per direction), as the closed
        form assumes.
        """
        t0 = env.now
        rec = StepTiming(t0, t0, 0.0)
        c = w.per_layer("compute_s")
        if w.background:
            pred, sel, x = w.per_layer("pred_s"), w.per_layer("select_s"), w.per_layer("xfer_s")
        with compute.request() as req:
            yield req
            yield env.timeout(w.head_s)
            for l in range(self.n_layers):
                before = env.now
                ev = self._ready_ev[l]
                if ev is not None and not ev.processed:
                    yield ev
                start = env.now
                rec.stall_s += start - before
                yield env.timeout(c[l])
                rec.compute.append((start, env.now))
                if w.background:
                    done = env.event()
                    self._ready_ev[l] = done
                    env.process(self._background(env, side, link, pred[l], sel[l], x[l], done, rec))
            yield env.timeout(w.tail_s)
        rec.end = env.now
        out.append(rec)

    @staticmethod
    def _background(env, side, link, pred_s, sel_s, xfer_s, done, rec):
        with side.request() as req:
            yield req
            s0 = env.now
            yield env.timeout(pred_s)
            yield env.timeout(sel_s)
            rec.side.append((s0, env.now))
        if xfer_s > 0:
            with link.request() as req:
                yield req
                x0 = env.now
                yield env.timeout(xfer_s)
                rec.xfer.append((x0, env.now))
        else:
            rec.xfer.append((env.now, env.now))
        done.succeed()
