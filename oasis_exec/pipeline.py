"""The per-layer prefetch pipeline: prediction -> selection -> transfer, in the background.

On CUDA, prediction and selection run on one side stream and copies on another; before layer l of step t+1
attends, the main stream waits only for layer l's transfer of step t (``wait(l)``). Nothing here forces a host
synchronisation on the main thread, except the host-gather path's hand-off: its copy list must reach the CPU, which
a worker thread waits for (the main thread blocks only if that worker has not yet enqueued layer l's DMA when
layer l of the next step begins).

Transfer paths (``ExecConfig.transfer``; ``auto`` takes path and programs from the measured table,
``oasis_exec.transfer_choice``, for the store's lane count; the chosen values are ``path``, ``uva_programs``,
``host_threads``):

- ``uva``: ``kernels.gather.uva_gather``, a persistent kernel on a bounded number of programs reading the pinned
  pool directly; fixed-shape copy list, no host sync at all.
- ``host``: the copy list (flat pool rows, destinations) goes to pinned memory, a worker thread waits for it and
  gathers the blocks into the layer's pinned staging buffer with one ``index_select`` per K/V on its own
  ``host_threads`` torch intra-op threads (``kernels.gather.host_gather_stage``), one DMA per K/V moves them, ``scatter_slots``
  writes the slots.

On CPU (tests) every stage runs inline, in order.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from oasis_core.selection import plan_step


class Prefetcher:
    def __init__(self, cfg, store, host, device, max_cap: int, synchronous: bool = False):
        self.cfg, self.store, self.host, self.device = cfg, store, host, device
        # synchronous: every stage inline on the current stream (the reference the tests compare against)
        self.cuda = device.type == "cuda" and not synchronous
        self.max_cap = max_cap
        L = store.L
        self.done = [None] * L  # CUDA event: layer l's transfer finished
        self.jobs = [None] * L  # host path: future that has enqueued layer l's transfer
        self.units = torch.zeros((), dtype=torch.int64, device=device)  # (block, head) units fetched, cumulative
        self.missing = torch.zeros((), dtype=torch.int64, device=device)
        # transfer="uva" / "host": that path, on cfg.uva_programs programs / cfg.host_threads threads. "auto": path
        # AND programs (threads, when a host entry names them) from the measured table for this engine's lane count
        # (oasis_exec/transfer_choice.py, oasis_exec/transfer_table.json).
        self.path, self.uva_programs, self.host_threads = cfg.transfer, cfg.uva_programs, cfg.host_threads
        self.choice = None
        if cfg.transfer == "auto":
            from .transfer_choice import explain

            self.choice = c = explain(store.B)
            if c["entry"] is None:
                import warnings

                warnings.warn(c["reason"], RuntimeWarning, stacklevel=2)
            self.path = c["path"]
            if self.path == "uva":
                self.uva_programs = c["uva_programs"]
            elif cfg.mode == "retrieval":  # copies on the critical path (fetch_now): no host-staged version there
                self.path = "uva"
            elif c["host_threads"]:
                self.host_threads = c["host_threads"]
        self.prof = []  # per layer-step records when profiling
        self.events = []  # (stage, layer, start_ms, end_ms) from the ref event collect() was given (CUDA)
        self.trace = None  # CPU: a list while the runner traces a step: (stage, layer, start_s, end_s) perf_counter
        self.keep = []  # tensors a captured graph reads across streams (moved to the graph after capture)
        self.host_gather_s = []
        if self.cuda:
            self.s_pred = torch.cuda.Stream(device)
            self.s_copy = torch.cuda.Stream(device)
            from kernels.gather import gather_thread

            # the host path's worker: one thread gathering with self.host_threads torch intra-op threads of its own
            # (no Python pool: every extra torch call or thread hand-off re-takes the GIL from the main thread)
            self.worker = gather_thread(self.host_threads) if self.path == "host" else ThreadPoolExecutor(max_workers=1)
            cap = store.B * store.H * max(max_cap, 1)
            self._stagers = []
            for _ in range(L if cfg.mode in ("proxy", "lookahead") else 0):  # one per layer: reused a step later, after wait(layer) joined its job
                from kernels.gather import HostStager

                st = HostStager(cap, store.bs, store.D, dtype=store.k[0].dtype, device=device, n_threads=None)
                st.src = torch.empty(2, cap, dtype=torch.int32, pin_memory=True)  # flat row (block * H + head), dst
                st.dst_pin = torch.empty(cap, dtype=torch.int32, pin_memory=True)
                st.dst_gpu = torch.empty(cap, dtype=torch.int32, device=device)
                st.free = None  # event: its last upload has completed
                self._stagers.append(st)

    # -- main-stream side -------------------------------------------------------------------------------------

    def wait(self, layer: int) -> None:
        """Make the current stream wait for layer ``layer``'s outstanding transfer."""
        fut = self.jobs[layer]
        if fut is not None:
            fut.result()
            self.jobs[layer] = None
        ev = self.done[layer]
        if ev is not None:
            if self.cfg.profile:
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                torch.cuda.current_stream().wait_event(ev)
                b.record()
                self.prof.append(("stall", layer, a, b))
            else:
                torch.cuda.current_stream().wait_event(ev)
            self.done[layer] = None

    def wait_all(self) -> None:
        for layer in range(len(self.done)):
            self.wait(layer)

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
        return (torch.where(live, src, neg).to(torch.int32).reshape(-1), head.to(torch.int32).reshape(-1),
                torch.where(live, dst, neg).to(torch.int32).reshape(-1))

    def select(self, layer, pred, rows, step, cap):
        """Algorithm 2 on this layer's rows (``oasis_core.selection.plan_step``); updates the mapping in place."""
        st = self.store
        # last_sel is kept relative to the current step (0 = now, older is more negative): one decrement per step
        # keeps the least-recently-selected order and lets a captured CUDA graph pass the constant step 0.
        res, ls = st.resident[layer][rows], st.last_sel[layer][rows] - 1
        plan = plan_step(res, ls, pred, cap, 0, self.max_cap if cap <= self.max_cap else cap)
        st.resident[layer][rows] = plan.resident
        st.last_sel[layer][rows] = plan.last_sel
        self.missing += plan.n_missing.sum()
        return plan

    def launch(self, layer, after, predict, lanes, rows, step, cap) -> None:
        """Background prediction -> selection -> transfer of ``layer`` once event ``after`` (main stream) fires.

        predict(): -> pred [R, K] (runs on the prediction stream); rows: the layer's rows (slice or index).
        """
        if not self.cuda:
            tr = self.trace
            t0 = time.perf_counter()
            pred = predict()
            t1 = time.perf_counter()
            plan = self.select(layer, pred, rows, step, cap)
            t2 = time.perf_counter()
            if tr is not None:  # inline, in order: the "side streams" of the CPU run one after the other
                tr += [("pred", layer, t0, t1), ("select", layer, t1, t2)]
            if not self.cfg.no_transfer:
                self._transfer_inline(layer, plan, lanes)
                if tr is not None:
                    tr.append(("transfer", layer, t2, time.perf_counter()))
            return
        prof = self.cfg.profile
        def ev():
            return torch.cuda.Event(enable_timing=prof)

        with torch.cuda.stream(self.s_pred):
            self.s_pred.wait_event(after)
            e0 = ev(); e0.record()
            pred = predict()
            e1 = ev(); e1.record()
            plan = self.select(layer, pred, rows, step, cap)
            e2 = ev(); e2.record()
            if prof:
                self.prof.append(("pred", layer, e0, e1))
                self.prof.append(("select", layer, e1, e2))
            if self.cfg.no_transfer:
                self.done[layer] = e2  # the next step's attention reads the mapping this stage rewrote
                return
            src, head, dst = self._copy_list(layer, plan, lanes)
            self.units += (src >= 0).sum()
            if self.path == "uva":
                planned = ev(); planned.record()
            else:
                stg = self._stagers[layer]
                n = src.shape[0]
                flat = torch.where(src >= 0, src * self.host.k[layer].shape[1] + head, -1)  # row of the flat view
                stg.src[0, :n].copy_(flat, non_blocking=True)
                stg.src[1, :n].copy_(dst, non_blocking=True)
                planned = torch.cuda.Event()
                planned.record()
        if self.path == "uva":
            from kernels.gather import uva_gather

            with torch.cuda.stream(self.s_copy):
                self.s_copy.wait_event(planned)
                t0 = ev(); t0.record()
                uva_gather(self.host.k[layer], self.host.v[layer], src, head, dst, self.store.k[layer],
                           self.store.v[layer], n_programs=self.uva_programs)
                t1 = ev(); t1.record()
            self._cross_stream(self.s_copy, src, head, dst)
            if prof:
                self.prof.append(("transfer", layer, t0, t1))
            self.done[layer] = t1
        else:
            self.jobs[layer] = self.worker.submit(self._host_job, layer, stg, n, planned)

    def _cross_stream(self, stream, *tensors) -> None:
        """Tensors read on ``stream`` but allocated on another: eagerly, tell the allocator (record_stream); under
        graph capture, keep them alive with the graph so no later capture allocation reuses their memory."""
        if torch.cuda.is_current_stream_capturing():
            self.keep.extend(tensors)
        else:
            for t in tensors:
                t.record_stream(stream)

    def _host_job(self, layer, stg, n, planned):
        from kernels.gather import host_gather_stage

        planned.synchronize()
        t_start = time.perf_counter()
        ids = stg.src[:, :n]
        live = ids[0] >= 0
        flat, dst = ids[0][live], ids[1][live]
        m = int(flat.shape[0])
        if stg.free is not None:
            stg.free.synchronize()  # the previous upload from this staging buffer has completed
        host_gather_stage(self.host.k[layer], self.host.v[layer], None, None, stg.stage_k, stg.stage_v, flat=flat)
        stg.dst_pin.fill_(-1)
        stg.dst_pin[:m].copy_(dst)
        self.host_gather_s.append(time.perf_counter() - t_start)
        prof = self.cfg.profile
        with torch.cuda.stream(self.s_copy):
            t0 = torch.cuda.Event(enable_timing=prof)
            t0.record()
            stg.upload(m)
            stg.dst_gpu.copy_(stg.dst_pin, non_blocking=True)
            stg.scatter(stg.dst_gpu, self.store.k[layer], self.store.v[layer])
            t1 = torch.cuda.Event(enable_timing=prof)
            t1.record()
        stg.free = t1
        if prof:
            self.prof.append(("transfer", layer, t0, t1))
        self.done[layer] = t1

    def _transfer_inline(self, layer, plan, lanes) -> None:
        """CPU (and synchronous CUDA) transfer: same copy list, plain indexing."""
        src, head, dst = self._copy_list(layer, plan, lanes)
        live = src >= 0
        self.units += live.sum()
        s, h, d = src[live].long(), head[live].long(), dst[live].long()
        hk, hv = self.host.k[layer], self.host.v[layer]
        if self.device.type == "cuda":
            s, h = s.cpu(), h.cpu()
            self.store.k[layer][d] = hk[s, h].to(self.device, non_blocking=True)
            self.store.v[layer][d] = hv[s, h].to(self.device, non_blocking=True)
        else:
            self.store.k[layer][d] = hk[s, h]
            self.store.v[layer][d] = hv[s, h]

    def fetch_now(self, layer, pred, lanes, rows, step, cap) -> None:
        """Synchronous selection + transfer on the current stream (retrieval mode: copies on the critical path)."""
        plan = self.select(layer, pred, rows, step, cap)
        if self.cfg.no_transfer:
            return
        if self.cuda and self.path == "uva":
            from kernels.gather import uva_gather

            src, head, dst = self._copy_list(layer, plan, lanes)
            self.units += (src >= 0).sum()
            uva_gather(self.host.k[layer], self.host.v[layer], src, head, dst, self.store.k[layer],
                       self.store.v[layer], n_programs=self.uva_programs)
        else:
            self._transfer_inline(layer, plan, lanes)

    # -- accounting ---------------------------------------------------------------------------------------------

    def collect(self, ref=None) -> dict:
        """Sum the profiled stage times (ms) since the last call; call after a device synchronisation. With ``ref``
        (an event of the main stream), also append each record to ``events`` as ms since ``ref``."""
        out = {}
        for kind, layer, a, b in self.prof:
            out[kind] = out.get(kind, 0.0) + a.elapsed_time(b)
            if ref is not None:  # untested on a GPU (written on a CPU-only session)
                self.events.append((kind, layer, ref.elapsed_time(a), ref.elapsed_time(b)))
        self.prof = []
        if self.host_gather_s:
            out["host_gather"] = 1e3 * sum(self.host_gather_s)
            self.host_gather_s = []
        return out

    def close(self) -> None:
        if self.cuda:
            self.worker.shutdown()
