"""The host-staged transfer path: a worker thread gathers a layer's blocks on the CPU, one DMA per K/V moves them.

``HostPath.stage(layer, src, head, dst)`` puts a layer's copy list (flat pool rows, destinations) into the layer's
pinned staging buffer on the current stream and returns its length; ``submit(layer, n, planned, end=None)`` hands
the layer to the worker, which waits for event ``planned`` (the list has reached pinned memory), gathers the blocks
into the staging buffer (``kernel="native"``: one GIL-free C call on ``threads`` OpenMP threads,
``oasis_kernels.host_native``; ``"torch"``: one ``index_select`` per K/V on the worker's own ``threads`` torch intra-op
threads, ``oasis_kernels.gather.host_gather_stage``), uploads them and scatters them into the slots on ``stream``, and
records ``end`` (graph mode: the external ``copied_x[layer]``; else a new event), which the returned future yields.
Each copied byte crosses host DRAM three times (pool read, staging write, DMA read), which bounds this path by the
host's memory bandwidth (experiments/transfer_paths/results/host_dma_pipeline.md).

An fp8 host pool (``HostPool.quantized``): the codes are staged and DMA'd as they are (half the bytes of bf16), with
each row's float32 scale beside them (a second gather of the same list; ``HostStager(quantized=True)``), and the
scatter kernel dequantizes into the slots.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch


class HostPath:
    def __init__(
        self, *, cfg, store, host, device, stream, threads: int, kernel: str, n_stagers: int, capacity: int, record
    ):
        """``n_stagers``: one staging buffer per layer (reused a step later, after the pipeline's wait(layer) joined
        its job); ``capacity``: copy-list entries a layer may hold; ``record(rec)``: keeps a profiling record."""
        self.cfg, self.store, self.host, self.stream, self.record = cfg, store, host, stream, record
        from oasis_kernels.gather import gather_thread

        # one thread gathering with ``threads`` torch intra-op threads of its own (no Python pool: every extra torch
        # call or thread hand-off re-takes the GIL from the main thread); kernel="native": one C call a layer on its
        # own OpenMP threads, the worker a plain thread
        native = kernel == "native"
        self.worker = ThreadPoolExecutor(max_workers=1) if native else gather_thread(threads)
        self.native = None
        if native:
            from oasis_kernels.host_native import Gatherer

            self.native = Gatherer(capacity, threads)
        self.stagers = []
        for _ in range(n_stagers):
            from oasis_kernels.gather import HostStager

            st = HostStager(
                capacity,
                store.bs,
                store.D,
                dtype=store.k[0].dtype,
                device=device,
                n_threads=None,
                quantized=host.quantized,
            )
            st.src = torch.empty(2, capacity, dtype=torch.int32, pin_memory=True)  # flat row (block * H + head), dst
            st.dst_pin = torch.empty(capacity, dtype=torch.int32, pin_memory=True)
            st.dst_gpu = torch.empty(capacity, dtype=torch.int32, device=device)
            st.free = None  # event: its last upload has completed
            self.stagers.append(st)
        self.gather_s, self.wait_s = [], []  # per layer-step: the worker's gather / its wait for list and buffer

    def stage(self, layer, src, head, dst) -> int:
        """Layer ``layer``'s copy list into its pinned staging buffer (current stream, no sync); its length."""
        stg = self.stagers[layer]
        n = src.shape[0]
        flat = torch.where(src >= 0, src * self.host.k[layer].shape[1] + head, -1)  # row of the flat view
        stg.src[0, :n].copy_(flat, non_blocking=True)
        stg.src[1, :n].copy_(dst, non_blocking=True)
        return n

    def submit(self, layer, n, planned, end=None) -> Future:
        """The worker's job of layer ``layer`` (``n`` staged entries) once ``planned`` fired; yields its end event."""
        return self.worker.submit(self._job, layer, n, planned, end)

    def _job(self, layer, n, planned, end=None):
        from oasis_kernels.gather import host_gather_stage

        stg = self.stagers[layer]
        t_wait = time.perf_counter()
        planned.synchronize()
        if stg.free is not None:
            stg.free.synchronize()  # the previous upload from this staging buffer has completed
        t_start = time.perf_counter()
        host = self.host
        hk, hv = host.k[layer], host.v[layer]
        sc = (host.k_scale[layer], host.v_scale[layer]) if host.quantized else None
        if self.native is not None:  # compaction, both gathers and the slot list in one GIL-free call
            m = self.native.gather_rows(hk, hv, stg.src[0], stg.src[1], n, stg.stage_k, stg.stage_v, stg.dst_pin)
            if sc is not None:  # an fp8 pool: the rows' scales, as 4-byte rows of the same list (a second call)
                nb, H = sc[0].shape
                self.native.gather_rows(
                    sc[0].view(nb, H, 1),
                    sc[1].view(nb, H, 1),
                    stg.src[0],
                    stg.src[1],
                    n,
                    stg.stage_ks.view(-1, 1),
                    stg.stage_vs.view(-1, 1),
                    stg.dst_pin,
                )
        else:
            ids = stg.src[:, :n]
            live = ids[0] >= 0
            flat, dst = ids[0][live], ids[1][live]
            m = int(flat.shape[0])
            stage_sc = (stg.stage_ks, stg.stage_vs) if sc is not None else None
            host_gather_stage(hk, hv, None, None, stg.stage_k, stg.stage_v, flat=flat, scales=sc, stage_scales=stage_sc)
            stg.dst_pin.fill_(-1)
            stg.dst_pin[:m].copy_(dst)
        self.wait_s.append(t_start - t_wait)
        self.gather_s.append(time.perf_counter() - t_start)
        prof = self.cfg.profile
        with torch.cuda.stream(self.stream):
            t0 = torch.cuda.Event(enable_timing=prof)
            t0.record()
            stg.upload(m)
            stg.dst_gpu.copy_(stg.dst_pin, non_blocking=True)
            if prof:
                t_dma = torch.cuda.Event(enable_timing=True)
                t_dma.record()
                self.record(("host_dma", layer, t0, t_dma))
            stg.scatter(stg.dst_gpu, self.store.k[layer], self.store.v[layer])
            t1 = end if end is not None else torch.cuda.Event(enable_timing=prof)
            t1.record()
        stg.free = t1
        if prof:
            self.record(("transfer", layer, t0, t1))
        return t1

    def take_times(self) -> dict:
        """The worker's summed gather and wait times (ms) since the last call ({} when it ran no job)."""
        if not self.gather_s:
            return {}
        out = {"host_gather": 1e3 * sum(self.gather_s), "host_wait": 1e3 * sum(self.wait_s)}
        self.gather_s, self.wait_s = [], []
        return out

    def close(self) -> None:
        self.worker.shutdown()
