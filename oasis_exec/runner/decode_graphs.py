"""CUDA graphs of decode steps: a step of B lanes (lanes 0..B-1) captured once and replayed after.

``DecodeGraphs.ok(lanes)`` says whether a step may run as a graph; ``run`` runs one (``replay``: the ordinary
step, ``ModelExec.decode_core``; ``spec_chain`` and ``spec_step``: a speculative step's draft chain and the rest of
it, ``ModelExec.spec_core``): the first step of a key eagerly (kernels compile, workspaces allocate), the second
captures it into a graph (the prefetch pipeline's side streams join before the capture ends; the UVA path's copies
get a graph of their own), every later one copies the step's inputs into the graph's static tensors and replays it,
bracketed by the working set's ``before_replay`` / ``after_replay`` (``WorkingSet``'s capture hooks: a resident set
hands them to its ``Prefetcher``). ``no_gc`` (``oasis_exec.capture``) keeps garbage
collection out of a capture.
"""

from __future__ import annotations

import torch

from ..capture import no_gc


class DecodeGraphs:
    def __init__(self, *, cfg, device: torch.device, model, sources):
        self.cfg, self.device, self.model, self.sources = cfg, device, model, sources
        self.pipe, self.H = model.pipe, model.H
        # (batch size, short, dense_slots), ("chain", batch size, k), ("spec", batch size, k, forced)
        #   -> (graph, static inputs, outputs)
        self.graphs = {}
        self._warm = set()
        self._capture_stream = None  # the step's graphs captured above a side stream (Prefetcher.step_priority)

    def keys(self) -> set:
        """The graph keys run so far (eagerly once, captured from the second time)."""
        return set(self._warm)

    def _stream(self):
        """The capture stream: torch's own, or one of the pipe's ``step_priority`` when that is not 0 (the side
        streams are to yield to the step: ``stream_priority`` low, pred_low, ...)."""
        prio = self.pipe.step_priority if self.pipe is not None else 0
        if not prio:
            return None
        if self._capture_stream is None:
            self._capture_stream = torch.cuda.Stream(self.device, priority=prio)
        return self._capture_stream

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
        if cfg.sparse and self.pipe.route.path != "uva" and not cfg.no_transfer and not self.pipe.ext.graph_host:
            return False
        return lanes_list == list(range(len(lanes_list)))

    def replay(self, lanes_list, toks, pos, sets, short="none", dense_slots=None):
        """The decode step of lanes 0..B-1 (``ok``): eager the first time, captured the second, replayed after; one
        graph per batch size, ``short`` and ``dense_slots`` (``ModelExec.decode_core``'s). Returns
        (logits [B, V], aux) of the graph's static outputs."""
        B, H = len(lanes_list), self.H

        def step(lanes, toks, pos, sets):
            return self.model.decode_core(
                lanes, slice(0, B * H), toks, pos, sets, None, short=short, dense_slots=dense_slots
            )

        return self.run((B, short, dense_slots), B, step, toks=toks, pos=pos, sets=sets)

    def spec_chain(self, B, toks, pos, k):
        """A speculative step's draft chain (``Drafts.chain``) of lanes 0..B-1 as a graph of its own
        (timed apart from the pass for adaptive k). Returns drafts [B, k] (the graph's static output)."""

        def chain(lanes, toks, pos):
            return self.model.drafts.chain(lanes, toks, pos, k)

        return self.run(("chain", B, k), B, chain, pipeline=False, toks=toks, pos=pos)

    def spec_step(self, B, toks, pos, drafts, lim, n_forced, sets):
        """The rest of a speculative step of lanes 0..B-1 (``ModelExec.spec_core``: pass, device-side acceptance,
        commit, resync), one graph per batch size, draft length and acceptance kind (greedy, or the benchmark's
        forced counts ``n_forced``). Returns (logits, accepted, emitted) of the graph's static outputs."""
        B, H, k = len(toks), self.H, drafts.shape[1]
        forced = n_forced is not None
        sp = self.model.ws.spec_pipe  # spec_predict beside: a step with its repair and one without are two graphs
        variant = sp.graph_key if sp is not None else None

        def step(lanes, toks, pos, drafts, lim, n_forced, sets):
            return self.model.spec_core(lanes, slice(0, B * H), toks, pos, drafts, lim, n_forced, sets)

        return self.run(
            ("spec", B, k, forced, variant),
            B,
            step,
            toks=toks,
            pos=pos,
            drafts=drafts,
            lim=lim,
            n_forced=n_forced,
            sets=sets,
        )

    def run(self, key, B, fn, pipeline=True, **inputs):
        """``fn(lanes, **inputs)`` for lanes 0..B-1 as graph ``key``: eager the first time (kernels compile,
        workspaces allocate), captured the second, replayed after with ``inputs`` (tensors or None) copied into the
        graph's static copies. ``pipeline``: the step launches the prefetch
        pipeline's stages (its side streams join before the capture ends; its copies are bracketed around each
        replay). Returns ``fn``'s outputs (the graph's static tensors once captured)."""
        ws = self.model.ws if pipeline else None
        g = self.graphs.get(key)
        if g is None and key not in self._warm:
            self._warm.add(key)
            return fn(torch.arange(B, device=self.device), **inputs)
        if g is None:
            if ws is not None:
                ws.wait_all()
            st = {n: None if t is None else t.clone() for n, t in inputs.items()}
            lanes = torch.arange(B, device=self.device)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            if ws is not None:
                ws.begin_capture(key)
            self.model.capturing = True
            try:
                with no_gc(), torch.cuda.graph(graph, stream=self._stream()):
                    out = fn(lanes, **st)
                    if ws is not None:
                        st["_keep"] = ws.end_capture(key)  # every side stream joins before the capture ends
            finally:
                self.model.capturing = False
            st["_lanes"] = lanes
            if ws is not None:
                ws.after_capture(key)  # UVA copy graphs: this step's copies, a graph of their own
            g = self.graphs[key] = (graph, st, out)
        graph, st, out = g
        for n, t in inputs.items():
            if t is not None:
                st[n].copy_(t)
        if ws is not None:
            ws.before_replay()  # the host path's graph mode: last step's copies are enqueued
        graph.replay()
        if ws is not None:
            ws.after_replay(key)  # UVA copy graphs: its copies; host path's graph mode: the worker's jobs
        return out

    def close(self) -> None:
        if self.graphs and self.device.type == "cuda":
            torch.cuda.synchronize()
        self.graphs.clear()  # freed now, not by a garbage collection in the middle of another engine's capture
