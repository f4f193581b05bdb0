"""CUDA graphs of decode steps: a step of B lanes (lanes 0..B-1) captured once and replayed after.

``DecodeGraphs.ok(lanes)`` says whether a step may run as a graph; ``replay`` runs it: the first step of a batch
size eagerly (kernels compile, workspaces allocate), the second captures ``ModelExec.decode_core`` into a graph (the
prefetch pipeline's side streams join before the capture ends; the UVA path's copies get a graph of their own,
``Prefetcher.capture_copies``), every later one copies the step's inputs into the graph's static tensors and
replays it, bracketed by ``Prefetcher.before_replay`` / ``after_replay``. ``no_gc`` keeps garbage collection out
of a capture.
"""

from __future__ import annotations

import contextlib
import gc

import torch


class DecodeGraphs:
    def __init__(self, *, cfg, device: torch.device, model, pipe, sources, n_kv_heads: int):
        self.cfg, self.device, self.model, self.pipe, self.sources, self.H = (
            cfg,
            device,
            model,
            pipe,
            sources,
            n_kv_heads,
        )
        self.graphs = {}  # (batch size, short, dense_slots) -> (graph, static inputs, logits, aux)
        self._warm = set()

    def ok(self, lanes_list) -> bool:
        """Whole-step CUDA graphs: no profiling events, no recording or replayed selection, lanes 0..B-1; the host
        transfer path only where its graph mode is available (``Prefetcher.graph_host``)."""
        cfg = self.cfg
        if (
            not cfg.cuda_graph
            or self.device.type != "cuda"
            or cfg.profile
            or self.sources.record is not None
            or (self.pipe is not None and not self.pipe.cuda)
        ):
            return False
        if cfg.sparse and self.pipe.path != "uva" and not cfg.no_transfer and not self.pipe.graph_host:
            return False
        return lanes_list == list(range(len(lanes_list)))

    def replay(self, lanes_list, toks, pos, sets, short="none", dense_slots=None):
        """The decode step of lanes 0..B-1 (``ok``): eager the first time, captured the second, replayed after; one
        graph per batch size, ``short`` and ``dense_slots`` (``ModelExec.decode_core``'s). Returns
        (logits [B, V], aux) of the graph's static outputs."""
        B = len(lanes_list)
        key = (B, short, dense_slots)
        g = self.graphs.get(key)
        if g is None and key not in self._warm:  # one eager step first: kernels compile, workspaces allocate
            self._warm.add(key)
            lanes = torch.arange(B, device=self.device)
            return self.model.decode_core(
                lanes, slice(0, B * self.H), toks, pos, sets, None, short=short, dense_slots=dense_slots
            )
        if g is None:
            if self.pipe is not None:
                self.pipe.wait_all()
            st = {
                "toks": toks.clone(),
                "pos": pos.clone(),
                "sets": None if sets is None else sets.clone(),
                "lanes": torch.arange(B, device=self.device),
            }
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            if self.pipe is not None:
                self.pipe.begin_capture(key)
            self.model.capturing = True
            try:
                with no_gc(), torch.cuda.graph(graph):
                    logits, aux = self.model.decode_core(
                        st["lanes"],
                        slice(0, B * self.H),
                        st["toks"],
                        st["pos"],
                        st["sets"],
                        None,
                        short=short,
                        dense_slots=dense_slots,
                    )
                    if self.pipe is not None:
                        self.pipe.wait_all()  # every side stream joins before the capture ends
            finally:
                self.model.capturing = False
            if self.pipe is not None:
                st["keep"], self.pipe.keep = self.pipe.keep, []
                self.pipe.capture_copies(key)  # UVA copy graphs: this step's copies, a graph of their own
            g = self.graphs[key] = (graph, st, logits, aux)
        graph, st, logits, aux = g
        st["toks"].copy_(toks)
        st["pos"].copy_(pos)
        if sets is not None:
            st["sets"].copy_(sets)
        if self.pipe is not None:
            self.pipe.before_replay()  # the host path's graph mode: last step's copies are enqueued
        graph.replay()
        if self.pipe is not None:
            self.pipe.after_replay(key)  # UVA copy graphs: its copies; host path's graph mode: the worker's jobs
        return logits, aux

    def close(self) -> None:
        if self.graphs and self.device.type == "cuda":
            torch.cuda.synchronize()
        self.graphs.clear()  # freed now, not by a garbage collection in the middle of another engine's capture


@contextlib.contextmanager
def no_gc():
    """No garbage collection inside: one that frees CUDA objects (a dropped engine's graphs, events, memory) during
    a stream capture invalidates the capture ("operation failed due to a previous error during capture"). Collects
    first, so a capture starts with no such garbage pending."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
