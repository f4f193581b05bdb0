"""The per-layer prefetch pipeline: prediction -> selection -> transfer, in the background.

This module holds the stages (side streams, events, the per-layer plan buffers, selection, the graph-capture
bookkeeping); each transfer path is a module of its own: ``transfer_uva.UvaPath`` (gather kernel, copy graphs),
``transfer_host.HostPath`` (pinned staging, worker thread, DMA + scatter) and ``transfer_inline.copy_inline``
(plain indexing: CPU and the synchronous mode).

On CUDA, prediction and selection run on one side stream and copies on another; before layer l of step t+1
attends, the main stream waits only for layer l's transfer of step t (``wait(l)``). Nothing here forces a host
synchronisation on the main thread, except the host-gather path's hand-off: its copy list must reach the CPU, which
a worker thread waits for (the main thread blocks only if that worker has not yet enqueued layer l's DMA when
layer l of the next step begins).

Transfer paths (``ExecConfig.transfer``; ``auto`` takes the path from the measured table,
``oasis_exec.transfer.choice``, for the store's lane count, and the UVA programs for each step's batch,
``gather_programs``; the chosen values are ``path``, ``uva_programs``, ``host_threads``, and ``priority``: the CUDA
priority of both side streams, ``ExecConfig.stream_priority`` or the table's):

- ``uva``: ``oasis_kernels.gather.uva_gather``, a persistent kernel on a bounded number of programs reading the pinned
  pool directly; fixed-shape copy list, no host sync at all. Under a CUDA graph with ``copy_graph`` on
  the step's copies are captured as a graph of their own on the copy stream (``capture_copies``), launched after
  each replay of the step (``after_replay``) and tied to it by the same external events as the host path's graph
  mode: a layer's copy may then run past the end of its step, until that layer of the next step; inside the step's
  graph (off; measured faster on the H200, where the gather copies faster alone than beside the step's kernels) every
  copy must end before the step does.
- ``host``: the copy list (flat pool rows, destinations) goes to pinned memory, a worker thread waits for it and
  gathers the blocks into the layer's pinned staging buffer: with ``host_kernel="native"`` in one GIL-free C call on
  ``host_threads`` OpenMP threads (``oasis_kernels.host_native``), with ``"torch"`` by one ``index_select`` per K/V on its
  own ``host_threads`` torch intra-op threads (``oasis_kernels.gather.host_gather_stage``); one DMA per K/V moves them,
  ``scatter_slots`` writes the slots. Each copied byte crosses host DRAM three times (pool read, staging write, DMA
  read), which bounds this path by the host's memory bandwidth (experiments/transfer_paths/results/host_dma_pipeline.md).

  Under a CUDA graph (``graph_host``: the step is captured with this path too) the hand-offs become *external*
  events (``torch.cuda.Event(external=True)``): the captured step records ``planned_x[l]`` once layer l's copy list
  has reached pinned memory and, before layer l attends, waits on ``copied_x[l]``, which the worker records after
  that layer's DMA + scatter of the previous step, outside the graph. The runner brackets each replay:
  ``before_replay()`` joins the previous step's jobs (so every ``copied_x`` record is issued before the graph that
  waits on it is launched), ``after_replay(key)`` submits this step's jobs. This graph mode ran on the H200 in the
  transfer-path sweeps (experiments/transfer_paths/results/host_path_in_graphs_priority.md) and its GPU tests
  (tests/gpu/test_exec_gpu.py; tests/integration/test_pipeline_graph_host.py checks its event protocol on the CPU).

Selection on CUDA (``self.cuda``): one ``oasis_kernels.plan_select`` launch per layer plans Algorithm 2 in place on the
layer's mapping, writes the copy list into buffers allocated once (stable addresses for CUDA-graph capture) and
adds the step's missing blocks and copies into ``counts`` on the device (``missing`` / ``units`` are views of it).
The torch path (``oasis_core.selection.plan_step`` + ``_copy_list``) is the reference: it runs on CPU and in the
synchronous mode. Both go through ``select`` (what profiler ranges and tests' hooks wrap).

On CPU (tests) every stage runs inline, in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from oasis_core.selection import plan_step

from ..config import STREAM_PRIORITIES
from ..transfer.choice import route
from ..transfer.host import HostPath
from ..transfer.inline import copy_inline
from ..transfer.uva import UvaPath
from .graph_copies import GraphCopies
from .select_buffers import SelectBuffers


@dataclass
class StageLog:
    """``--profile``'s records of the prefetch stages: ``prof`` (stage, layer, start event, end event) until
    ``collect``; ``events`` (stage, layer, start_ms, end_ms) from the reference event ``collect`` was given
    (CUDA); ``trace`` a list while the runner traces a step on the CPU: (stage, layer, start_s, end_s)."""

    prof: list = field(default_factory=list)
    events: list = field(default_factory=list)
    trace: list | None = None


class Prefetcher:
    def __init__(self, *, cfg, store, host, device, caps, synchronous: bool = False):
        self.cfg, self.store, self.host, self.device = cfg, store, host, device
        # synchronous: every stage inline on the current stream (the reference the tests compare against)
        self.cuda = device.type == "cuda" and not synchronous
        self.caps = caps  # fetch_caps.DeviceCaps: each layer plan's cap, from the run's policy
        self.zero_rows = None  # bool [R] of the decode step's rows planned with cap 0 (short lanes); see _bg_cap
        self._zero_cap = None  # (zero_rows, int cap, its cap tensor [R]): _bg_cap's, made once a step
        L = store.L
        self.done = [None] * L  # CUDA event: layer l's transfer finished
        self.jobs = [None] * L  # host path: future that has enqueued layer l's transfer
        # cumulative [predicted blocks not resident, (block, head) units fetched]; plan_select adds into it
        self.counts = torch.zeros(2, dtype=torch.int64, device=device)
        # the path, its programs / threads and the side streams' priority (oasis_exec/transfer/choice.py)
        self.route = route(cfg, store.B)
        self.log = StageLog()  # profiling records (--profile)
        self.bufs = SelectBuffers(cfg=cfg, store=store, max_cap=caps.max_cap, device=device)
        self._lanes = None  # the copy list's lanes during launch / fetch_now's select
        self.uva = UvaPath(
            cfg=cfg,
            store=store,
            host=host,
            choice=self.route.choice if self.route.path == "uva" else None,
            programs=self.route.uva_programs,
        )
        self.s_pred = self.s_copy = None  # the side streams (CUDA only)
        if self.cuda:
            # CUDA priorities (lower runs first; torch graphs keep a captured kernel's priority, they instantiate
            # with use-node-priority) of the captured step and the side streams: STREAM_PRIORITIES. A side stream
            # above the step gets its blocks scheduled ahead of the step's waiting ones; below, it fills the SMs
            # the step leaves free (DecodeGraphs captures on a stream of priority step_priority).
            _, pred, copy = STREAM_PRIORITIES[self.route.priority]
            self.s_pred = torch.cuda.Stream(device, priority=pred)
            self.s_copy = torch.cuda.Stream(device, priority=copy)
        self.ext = GraphCopies(cfg=cfg, route=self.route, n_layers=L, cuda=self.cuda, copy_stream=self.s_copy)
        self.host_path = None
        if self.cuda and self.route.path == "host":  # the only path with staging buffers and a worker
            self.host_path = HostPath(
                cfg=cfg,
                store=store,
                host=host,
                device=device,
                stream=self.s_copy,
                threads=self.route.host_threads,
                kernel=self.route.host_kernel,
                n_stagers=L if cfg.mode_spec.background else 0,
                capacity=store.B * store.H * max(caps.max_cap, 1),
                record=self._record,
            )

    @property
    def step_priority(self) -> int:
        """The captured step's CUDA priority (``STREAM_PRIORITIES``; 0 off CUDA)."""
        return STREAM_PRIORITIES[self.route.priority][0] if self.cuda else 0

    @property
    def missing(self):
        """Predicted blocks not resident so far (a view of ``counts``)."""
        return self.counts[0]

    @property
    def units(self):
        """(block, head) units fetched so far (a view of ``counts``)."""
        return self.counts[1]

    # -- main-stream side -------------------------------------------------------------------------------------

    def wait(self, layer: int, external: bool = True) -> None:
        """Make the current stream wait for layer ``layer``'s outstanding transfer (``external``: under capture in
        the host path's graph mode or with UVA copy graphs, also for the previous step's copies, outside the
        graph)."""
        if (
            external
            and self.cuda
            and (self.ext.graph_host or self.ext.copy_graph)
            and not self.cfg.no_transfer
            and torch.cuda.is_current_stream_capturing()
        ):
            torch.cuda.current_stream().wait_event(self.ext.copied[layer])  # recorded by the worker, a step earlier
        fut = self.jobs[layer]
        if fut is not None:
            self.done[layer] = fut.result()  # the host path's job: its end event
            self.jobs[layer] = None
        ev = self.done[layer]
        if ev is not None:
            if self.cfg.profile:
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                torch.cuda.current_stream().wait_event(ev)
                b.record()
                self.log.prof.append(("stall", layer, a, b))
            else:
                torch.cuda.current_stream().wait_event(ev)
            self.done[layer] = None
        self.caps.layer_ready(layer)

    def wait_all(self) -> None:
        for layer in range(len(self.done)):
            self.wait(layer, external=False)

    # -- the stages ---------------------------------------------------------------------------------------------

    def _copy_list(self, layer, plan, lanes):
        """Fixed-shape copy list [R * C] (int32) of one layer's plan: host block, head, destination slot."""
        st = self.store
        B = lanes.shape[0]
        fb, fs = plan.fetch_block, plan.fetch_slot  # [B * H, C]
        C = fb.shape[1]
        live = fb >= 0
        lane_r = lanes.repeat_interleave(st.H)[:, None].expand(-1, C)
        head = torch.arange(st.H, device=fb.device).repeat(B)[:, None].expand(-1, C)
        src = st.host_table[lane_r, fb.clamp(min=0)]
        dst = (lane_r * st.H + head) * st.W + fs.clamp(min=0)
        neg = torch.full_like(src, -1)
        return (
            torch.where(live, src, neg).to(torch.int32).reshape(-1),
            head.to(torch.int32).reshape(-1),
            torch.where(live, dst, neg).to(torch.int32).reshape(-1),
        )

    def select(self, layer, pred, rows, step, cap):
        """Algorithm 2 on this layer's rows; updates the mapping in place.

        On CUDA: one ``oasis_kernels.plan_select`` launch (``_select_fused``) that also writes the copy list for the lanes
        ``launch`` / ``fetch_now`` set in ``_lanes`` and counts into ``counts``; returns a ``PlanSelectOut``
        (``fetch_block``, ``fetch_slot``, ``n_fetch``, ``n_missing``, ``n_kept``, and ``src``/``head``/``dst``).
        Else (CPU, synchronous mode: the reference) ``oasis_core.selection.plan_step`` in torch; returns its
        ``StepPlan``. The signature stays (layer, pred, rows, step, cap) for the wrappers that hook it (profiler
        ranges, tests)."""
        if self._fused(cap):
            return self._select_fused(layer, pred, rows, cap, self._lanes)
        st = self.store
        # last_sel is kept relative to the current step (0 = now, older is more negative): one decrement per step
        # keeps the least-recently-selected order and lets a captured CUDA graph pass the constant step 0.
        res, ls = st.resident[layer][rows], st.last_sel[layer][rows] - 1
        wide = isinstance(cap, int) and cap > self.caps.max_cap  # an int cap above the buffers' width widens the plan
        plan = plan_step(res, ls, pred, cap, 0, cap if wide else self.caps.max_cap)
        st.resident[layer][rows] = plan.resident
        st.last_sel[layer][rows] = plan.last_sel
        self.counts[0] += plan.n_missing.sum()
        return plan

    def _fused(self, cap) -> bool:
        """Whether select plans with plan_select: on CUDA (not synchronous), ``cfg.fused_ops`` on (off: the torch
        ``plan_step``, the reference), with a cap its buffers hold."""
        return (
            self.cfg.fused_select
            and self.cfg.fused_ops
            and self.cuda
            and (not isinstance(cap, int) or cap <= self.caps.max_cap)
        )

    def row_ids(self, rows):
        """The layer's rows as an int64 device tensor (``SelectBuffers.row_ids``)."""
        return self.bufs.row_ids(rows)

    def _select_fused(self, layer, pred, rows, cap, lanes=None, out=None, **extra):
        """Selection (+ the copy list when ``lanes`` is given and transfers are on) of a layer in one launch on the
        current stream, into the layer's preallocated buffers (``out``: others); missing blocks and copies are added
        into ``counts`` on the device. No host sync. ``extra``: ``plan_select``'s hot-cache arguments (``gather``,
        ``slots_out``; ``_fetch_hot``)."""
        from oasis_kernels.plan_select import plan_select

        st = self.store
        if pred.dtype not in (torch.int64, torch.int32):
            pred = pred.long()
        copy = lanes is not None and not self.cfg.no_transfer
        if self.bufs.marks is not None and "marks" not in extra:
            # s_pred is None on CPU (tests force the fused path there)
            bg = self.s_pred is not None and torch.cuda.current_stream() == self.s_pred
            extra["marks"] = self.bufs.marks[0 if bg else 1]
        return plan_select(
            st.resident[layer],
            st.last_sel[layer],
            self.row_ids(rows),
            pred,
            cap,
            self.caps.max_cap,
            0,
            lanes=lanes,
            H=st.H,
            W=st.W,
            host_table=st.host_table if copy else None,
            counters=self.counts,
            plan=True,
            out=self.bufs.lists[layer % len(self.bufs.lists)] if out is None else out,
            **extra,
        )

    def _plan_list(self, layer, plan, lanes):
        """(src, head, dst, preallocated) of a plan: plan_select's own list (its copies already counted), else
        ``_copy_list`` of the plan (counted here)."""
        if getattr(plan, "src", None) is not None:
            return plan.src, plan.head, plan.dst, True
        src, head, dst = self._copy_list(layer, plan, lanes)
        self.counts[1] += (src >= 0).sum()
        return src, head, dst, False

    def _select_for(self, layer, pred, lanes, rows, step, cap):
        """select with the copy list's lanes handed over aside (select's signature has none)."""
        self._lanes = lanes
        try:
            return self.select(layer, pred, rows, step, cap)
        finally:
            self._lanes = None

    def _cap(self, layer, pred, rows):
        """The fetch cap of this layer's plan (``DeviceCaps.cap``): an int, or an int64 tensor [R] on the device."""
        caps = self.caps
        if caps.fixed is not None:
            return caps.fixed
        idx = self.row_ids(rows)
        return caps.cap(layer, self.store.resident[layer][idx], pred, rows=idx)  # row state keyed by store row

    def _bg_cap(self, layer, pred, rows):
        """``_cap`` of a background plan, 0 for the rows in ``zero_rows`` (short lanes, set by the decode step for
        its rows: a bool tensor [R] on the device; they must not evict before their crossing). An int cap wider
        than the plan buffers is left as it is (no short row has a block missing)."""
        cap = self._cap(layer, pred, rows)
        z = self.zero_rows
        if z is None or (isinstance(cap, int) and cap > self.caps.max_cap):
            return cap
        if isinstance(cap, int):  # the same for every layer's stages of the step: made once (two launches a stage)
            got = self._zero_cap
            if got is not None and got[0] is z and got[1] == cap:
                return got[2]
            t = torch.full(z.shape, cap, dtype=torch.int64, device=z.device).masked_fill(z, 0)
            self._zero_cap = (z, cap, t)  # (made and read on the prediction stream only)
            return t
        return cap.masked_fill(z, 0)

    def launch(self, layer, after, predict, lanes, rows) -> None:
        """Background prediction -> cap -> selection -> transfer of ``layer`` once event ``after`` (main stream)
        fires.

        predict(): -> pred [R, K] (runs on the prediction stream); rows: the layer's rows (slice or index).
        """
        if not self.cuda:
            self._launch_inline(layer, predict, lanes, rows)
            return
        ev = self._event
        with torch.cuda.stream(self.s_pred):
            self.s_pred.wait_event(after)
            e0 = ev()
            e0.record()
            pred = predict()
            cap = self._bg_cap(layer, pred, rows)
            e1 = ev()
            e1.record()
            # one plan_select launch: selection, copy list and counters (the "select" stage includes the copy list)
            plan = self._select_for(layer, pred, lanes, rows, 0, cap)  # step 0: last_sel is relative (see select)
            e2 = ev()
            e2.record()
            if self.cfg.profile:
                self.log.prof += [("pred", layer, e0, e1), ("select", layer, e1, e2)]
            if self.cfg.no_transfer:
                self.done[layer] = e2  # the next step's attention reads the mapping this stage rewrote
                return
            src, head, dst, prealloc = self._plan_list(layer, plan, lanes)
            staged = self._stage(layer, src, head, dst, prealloc, lanes.shape[0])
        if staged is None:  # captured: the copy runs outside the step's graph, after each replay
            return
        if self.route.path == "uva":
            self._gather(layer, staged, src, head, dst, prealloc, lanes.shape[0])
        else:
            self.jobs[layer] = self.host_path.submit(layer, *staged)

    def _event(self):
        return torch.cuda.Event(enable_timing=self.cfg.profile)

    def _launch_inline(self, layer, predict, lanes, rows) -> None:
        """``launch`` on the CPU (and the synchronous mode): every stage inline, in order (the "side streams" of the
        CPU run one after the other), timed into ``log.trace`` when the runner traces the step."""
        tr = self.log.trace
        t0 = time.perf_counter()
        pred = predict()
        t1 = time.perf_counter()
        plan = self.select(layer, pred, rows, 0, self._bg_cap(layer, pred, rows))
        t2 = time.perf_counter()
        if tr is not None:
            tr += [("pred", layer, t0, t1), ("select", layer, t1, t2)]
        if not self.cfg.no_transfer:
            self._transfer_inline(layer, plan, lanes)
            if tr is not None:
                tr.append(("transfer", layer, t2, time.perf_counter()))

    def _stage(self, layer, src, head, dst, prealloc, batch):
        """On the prediction stream, after the copy list: what the copy waits for. Under capture with the UVA
        path's copy graphs or the host path's graph mode, the layer joins the key's copies (``GraphCopies``) and
        None is returned; else the UVA path's ``planned`` event, or the host path's (staged count, event)."""
        capturing = torch.cuda.is_current_stream_capturing()
        if self.route.path == "uva" and not (self.ext.copy_graph and capturing):
            planned = self._event()
            planned.record()
            return planned
        if self.route.path == "uva":  # the copy goes into this key's copy graph (capture_copies)
            if not prealloc:
                self.cross_stream(self.s_copy, src, head, dst)  # kept with the step's graph
            item = (src, head, dst, self.gather_programs(batch))
        else:
            item = self.host_path.stage(layer, src, head, dst)
            if not capturing:
                planned = torch.cuda.Event()
                planned.record()
                return item, planned
        # graph mode: the worker / the copy graph starts after each replay
        self.ext.planned[layer].record()
        joined = torch.cuda.Event()
        joined.record()
        self.done[layer] = joined  # the prediction stream rejoins the main stream by the capture's end
        self.ext.add(layer, item)
        return None

    def _gather(self, layer, planned, src, head, dst, prealloc, batch) -> None:
        """The UVA path's copy of ``layer`` on the copy stream once ``planned`` fires."""
        ev = self._event
        with torch.cuda.stream(self.s_copy):
            self.s_copy.wait_event(planned)
            t0 = ev()
            t0.record()
            self.uva.gather(layer, src, head, dst, self.gather_programs(batch))
            t1 = ev()
            t1.record()
        if not prealloc:  # plan_select's lists live in buffers allocated once: nothing to hand across
            self.cross_stream(self.s_copy, src, head, dst)
        if self.cfg.profile:
            self.log.prof.append(("transfer", layer, t0, t1))
        self.done[layer] = t1

    def gather_programs(self, batch: int) -> int:
        """UVA gather programs for a step of ``batch`` lanes (``UvaPath.programs_for``; the table's choice for that
        batch under ``transfer="auto"``, else ``uva_programs``)."""
        return self.uva.programs_for(batch)

    def _record(self, rec) -> None:
        """Keep one profiling record (stage, layer, start event, end event) for ``collect``."""
        self.log.prof.append(rec)

    def cross_stream(self, stream, *tensors) -> None:
        """Tensors read on ``stream`` but allocated on another: eagerly, tell the allocator (record_stream); under
        graph capture, keep them alive with the graph so no later capture allocation reuses their memory."""
        if torch.cuda.is_current_stream_capturing():
            self.ext.keep.extend(tensors)
        else:
            for t in tensors:
                t.record_stream(stream)

    def begin_capture(self, key) -> None:
        """The runner is about to capture the step of graph ``key``: host-path layers launched now belong to it."""
        self.ext.begin(key)

    def before_replay(self) -> None:
        """Join the host worker's jobs of the previous step (their ``copied_x`` records are then issued)."""
        for layer, fut in enumerate(self.jobs):
            if fut is not None:
                fut.result()
                self.jobs[layer] = None
                self.done[layer] = None  # the graph waits on copied_x itself

    def capture_copies(self, key) -> None:
        """After the step of graph ``key`` was captured (UVA path, ``copy_graph``): capture its copies as a graph of
        their own on the copy stream; per layer, in order: wait for ``planned_x[l]`` (recorded by the step's graph
        once layer l's copy list is written), gather, record ``copied_x[l]`` (which the next step's graph waits for
        before layer l attends). ``after_replay`` launches it after each replay of the step."""
        layers = self.ext.layers.get(key)
        if not (self.ext.copy_graph and layers):
            return
        self.uva.capture(key, layers, planned=self.ext.planned, copied=self.ext.copied, stream=self.s_copy)

    def after_replay(self, key) -> None:
        """After the replay of graph ``key`` was launched: launch its copy graph on the copy stream (UVA,
        ``copy_graph``; an eager step or a capture after it waits for them through ``done``), or submit the host
        worker's jobs (the host path's graph mode)."""
        if self.ext.copy_graph and self.uva.replay(key, self.s_copy):  # copy graphs exist only with copy_graph
            for layer, _ in self.ext.layers[key]:
                self.done[layer] = self.ext.copied[layer]
            return
        for layer, n in self.ext.layers.get(key, ()):
            self.jobs[layer] = self.host_path.submit(layer, n, self.ext.planned[layer], self.ext.copied[layer])

    def _transfer_inline(self, layer, plan, lanes) -> None:
        """CPU (and synchronous CUDA) transfer: same copy list, plain indexing."""
        src, head, dst, _ = self._plan_list(layer, plan, lanes)
        copy_inline(self.store, self.host, self.device, layer, src, head, dst)

    def fetch_now(self, layer, pred, lanes, rows, slots: bool = False):
        """Synchronous selection + transfer on the current stream (retrieval, hisparse: copies on the critical path).

        ``slots`` (a hot cache): on the fused CUDA path, returns the attention's slot list int32 [R, K] (the slot of
        each predicted block after the fetch, written by the same ``plan_select`` launch, ``_fetch_hot``); None
        otherwise (the caller builds it from the updated table: ``SparseStore.selected_slots``)."""
        cap = self._cap(layer, pred, rows)
        if slots and self._fused(cap):
            return self._fetch_hot(layer, pred, lanes, rows, cap)
        plan = self._select_for(layer, pred, lanes, rows, 0, cap)
        if self.cfg.no_transfer:
            return None
        if self.cuda and self.route.path == "uva":
            src, head, dst, _ = self._plan_list(layer, plan, lanes)
            self.uva.gather(layer, src, head, dst, self.gather_programs(lanes.shape[0]))
        else:
            self._transfer_inline(layer, plan, lanes)
        return None

    def _fetch_hot(self, layer, pred, lanes, rows, cap):
        """A hot cache's fetch on CUDA (hisparse): one ``plan_select`` launch plans the rows over the hot cache
        (least-recently-selected victims, the uncapped cap), counts, writes the slot list and, with
        ``cfg.fused_hot_gather`` on the UVA path, reads the misses from the pinned host pool into their slots
        (find-misses + read-from-host fused; not with an fp8 host pool, whose reads dequantize); else the copy list
        goes to the UVA gather (a second launch) or, on the host path, to plain indexing. Everything on the current
        stream, no host sync. Returns the slot list [R, K]."""
        st, host = self.store, self.host
        R, K = pred.shape
        copy = not self.cfg.no_transfer
        # plan_select's fused host reads copy the pool as it is: an fp8 pool takes the dequantizing UVA gather
        fused = copy and self.cfg.fused_hot_gather and self.route.path == "uva" and not host.quantized
        so = self.bufs.slot_buf[: R * K].view(R, K)
        out = self._select_fused(
            layer,
            pred,
            rows,
            cap,
            lanes,
            out=self.bufs.lists[0],
            gather=(host.k[layer], host.v[layer], st.k[layer], st.v[layer]) if fused else None,
            slots_out=so,
        )
        if copy and not fused:
            if self.route.path == "uva":
                self.uva.gather(layer, out.src, out.head, out.dst, self.gather_programs(lanes.shape[0]))
            else:
                copy_inline(self.store, self.host, self.device, layer, out.src, out.head, out.dst)
        return so

    # -- accounting ---------------------------------------------------------------------------------------------

    def collect(self, ref=None) -> dict:
        """Sum the profiled stage times (ms) since the last call; call after a device synchronisation. With ``ref``
        (an event of the main stream), also append each record to ``events`` as ms since ``ref``."""
        out = {}
        log = self.log
        for kind, layer, a, b in log.prof:
            out[kind] = out.get(kind, 0.0) + a.elapsed_time(b)
            if ref is not None:  # the bench's --profile runs (H200, experiments/real_model_step_cost/README.md)
                log.events.append((kind, layer, ref.elapsed_time(a), ref.elapsed_time(b)))
        log.prof = []
        if self.host_path is not None:
            out.update(self.host_path.take_times())
        return out

    def close(self) -> None:
        if self.host_path is not None:
            self.host_path.close()
        self.uva.close()
