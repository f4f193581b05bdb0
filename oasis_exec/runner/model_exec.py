"""Model execution: the layer loop of one runner call over the working sets (what the GPU computes).

``ModelExec`` runs a prefill chunk (``prefill``), a benchmark's synthesized prefill (``synthesize``), the decode
step (``decode_core``: device work only, so the same code runs eagerly and under CUDA-graph capture) and a
speculative step's verification pass, acceptance and commit (``decode_spec``, ``spec_core``, ``commit_spec``).
The loop computes each layer's q/k/v and output (``Decoder.qkv`` / ``finish``); what a layer does with its KV is
its working set's (``oasis_exec.workingset``: one object per mode family, ``WorkingSet``'s interface): the mode's
set for every full-attention layer, a ``WindowSet`` for a hybrid model's sliding layers.

Short contexts (``short``, decided per step by the runner on the host from the positions): "none" (the plain
step), "some" (short lanes' masks carried on the device), "all" (the resident-dense step: no draft row, no
selection, fetch or write-back); see ``workingset/resident.py``.

Speculative steps (``oasis_exec.runner.speculative``): ``Drafts.chain`` drafts ``k`` tokens a lane, ``decode_spec``
is the verification pass over ``k + 1`` positions and ``commit_spec`` keeps what the accepted tokens wrote (device-side
masks, no host list) and launches the lookahead prediction for the next step; ``spec_core`` is the pass, the
device-side acceptance, the commit and the resync in one capturable call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..kv.ring import RingKV, ring_extra
from ..workingset.base import SetParts
from ..workingset.families import build_sets
from ..workingset.selector import Selector
from ..workingset.step import SHORT_STEPS, decode_step
from .speculative import emitted_tokens, greedy_accepted


@dataclass
class StepTrace:
    """The profiling records of decode steps (``ExecConfig.profile``). ``step``: the bench's index of the step
    about to run when it traces that one (else None); a traced step appends [step, layer, stage, start_ms, end_ms]
    (ms since layer 0 began) to ``layer_events``: "layers" (main stream, stalls included), "stall", and the
    prefetch stages "pred", "select", "transfer". ``stage_ms``: summed stage times (CUDA); ``step_ref``: the event
    layer 0 of a traced step began with (CUDA)."""

    step: int | None = None
    layer_events: list = field(default_factory=list)
    stage_ms: dict = field(default_factory=dict)
    step_ref: object = None


class _LayerMarks:
    """``--profile``'s marks of one decode step's layers: a CUDA event as each layer begins (on CUDA; their sum is
    ``stage_ms["layers"]``), or the host clock when the bench traces the step on the CPU; ``end`` turns them into
    ``StepTrace`` records (with the prefetcher's own stage records on the CPU)."""

    def __init__(self, me):
        self.me = me
        cfg = me.cfg
        self.prof = cfg.profile and me.device.type == "cuda"
        self.trace = cfg.profile and me.trace.step is not None and not me.capturing
        self.cpu = [] if self.trace and not self.prof else None  # perf_counter as each layer begins, then the end
        if self.cpu is not None and me.pipe is not None:
            me.pipe.log.trace = []
        self.ev = [] if self.prof else None

    def begin(self) -> None:
        if self.ev is not None:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.ev.append(e)
        if self.cpu is not None:
            self.cpu.append(time.perf_counter())

    def end(self) -> None:
        me, L, tr = self.me, self.me.L, self.me.trace
        if self.ev is not None:
            self.begin()
            ev = self.ev
            torch.cuda.current_stream().synchronize()
            t = sum(ev[i].elapsed_time(ev[i + 1]) for i in range(L))
            tr.stage_ms["layers"] = tr.stage_ms.get("layers", 0.0) + t
            if self.trace:  # --profile's layer events (ran on the H200); side-stream stages: _decode, collect
                ref = tr.step_ref = ev[0]
                tr.layer_events += [
                    [tr.step, i, "layers", ref.elapsed_time(ev[i]), ref.elapsed_time(ev[i + 1])] for i in range(L)
                ]
        if self.cpu is not None:
            self.begin()
            marks = self.cpu
            t0 = marks[0]
            ev = [("layers", i, marks[i], marks[i + 1]) for i in range(L)]
            if me.pipe is not None:
                ev += me.pipe.log.trace
                me.pipe.log.trace = None
            tr.layer_events += [[tr.step, l, k_, 1e3 * (a - t0), 1e3 * (b - t0)] for k_, l, a, b in ev]


class ModelExec:
    def __init__(
        self,
        *,
        cfg,
        decoder,
        drafts,
        store,
        host,
        pipe,
        caps,
        trace: StepTrace,
        max_lanes: int,
        device,
        dtype,
        short=None,
    ):
        self.cfg, self.device, self.dec, self.drafts, self.trace, self.pipe = cfg, device, decoder, drafts, trace, pipe
        s = decoder.shape
        self.L, self.H = s.n_layers, s.n_kv_heads
        self.capturing = False  # set by DecodeGraphs while a step is captured
        # sliding-window layers (ModelSpec.layer_windows): their KV in a ring a lane, dense attention (kv/ring.py)
        self.ring = (
            RingKV(s, max_lanes, ring_extra(cfg), dtype, device, kernel=cfg.ring_kernel) if s.is_hybrid else None
        )
        self.selector = Selector(
            store=store,
            top_k=cfg.top_k,
            n_kv_heads=self.H,
            block_score=cfg.block_score,
            topk_kernel=cfg.topk_kernel,
            synthetic_topk=cfg.synthetic_topk,
        )
        parts = SetParts(
            cfg, store, host, pipe, caps, self.selector, short, device, dtype, cfg.block_size, self.H, cfg.top_k, self.L
        )
        self.sets = build_sets(parts, cfg.mode_spec, self.ring)  # the working set of each layer
        self.ws = next((w for w in self.sets if w.family != "window"), self.sets[0])  # the mode's
        if drafts is not None and drafts.conf is not None:  # ExecConfig.draft_gate
            self.ws.draft_conf = drafts.conf
        self.own = [l for l in range(self.L) if self.sets[l] is self.ws]  # the layers of the mode's set

    def synthesize(self, a) -> None:
        """KV of positions 0..prompt_len-2 filled with random values; the last prompt token decodes first."""
        n_full = (a.prompt_len - 1) // self.cfg.block_size
        g = torch.Generator(device=self.device).manual_seed(a.seed)
        st, D = self.selector.store, self.dec.shape.head_dim
        if st.kmin is not None:
            for l in self.own:  # a sliding layer has no summaries (its ring is filled below)
                base = torch.randn(self.H, n_full, D, generator=g, device=self.device)
                st.kmin[l, a.lane, :, :n_full] = (base - 1.0).to(st.kmin.dtype)
                st.kmax[l, a.lane, :, :n_full] = (base + 1.0).to(st.kmax.dtype)
        if st.tok is not None:  # block_score=tokens: random kept channels of every token of the full blocks
            kp = st.tok.kp
            for l in self.own:
                kp[l, a.lane, :, :n_full] = torch.randn(
                    self.H, n_full, *kp.shape[-2:], generator=g, device=self.device
                ).to(kp.dtype)
        self.ws.synthesize(a, g, self.own)
        if self.ring is not None:  # the sliding layers' windows: random too
            self.sets[next(iter(self.ring.windows))].synthesize(a, g, list(self.ring.windows))
        self.drafts.reset(a)

    def prefill(self, ch):
        """One chunk of a real prefill (``RunnerCall.prefill``). Returns None before the last chunk, else
        (logits [1, V] of the last prompt token, the draft head's hidden states {layer: [hidden]})."""
        dev = self.device
        pos = torch.arange(ch.start, ch.start + len(ch.tokens), device=dev)
        x = self.dec.embed_tokens(torch.tensor(ch.tokens, device=dev))
        aux, layers_aux, attends = {}, self.drafts.layers, self.drafts.attends
        for l in range(self.L):
            q, k, v = self.dec.qkv(l, x, pos)  # q [n, Hq, D], k/v [n, H, D]
            x = self.dec.finish(l, x, self.sets[l].prefill_layer(l, ch, q, k, v, pos))
            if l in layers_aux:
                aux[l] = x if attends else x[-1]
        if attends:  # the draft layer's K/V of the chunk's positions
            self.drafts.head.prefill_chunk(ch.lane, ch.start, torch.cat([aux[i] for i in layers_aux], -1), ch.tokens)
            aux = {i: a[-1] for i, a in aux.items()}
        if not ch.last:
            return None
        self.ws.prefill_done(ch)
        return self.dec.logits(x[-1:]), aux

    def _layers(self, s, r, x, verify: bool):
        """The layer loop of a decode step or verification pass over ``s`` (``DecodeStep``) and the mode's rows
        ``r``. Returns (x [B * nq, hidden], the draft head's features {layer: [B, nq, hidden]})."""
        marks = _LayerMarks(self)
        aux, layers_aux = {}, self.drafts.layers
        for l in range(self.L):
            marks.begin()
            q, k, v = self.dec.qkv(l, x, s.positions)
            q = q.view(s.B, s.nq, q.shape[1], -1)
            k = k.view(s.B, s.nq, self.H, -1)
            v = v.view(s.B, s.nq, self.H, -1)
            ws = self.sets[l]
            attn = ws.verify_layer(l, s, r, q, k, v) if verify else ws.layer(l, s, r, q, k, v)
            x = self.dec.finish(l, x, attn)
            if l in layers_aux:
                aux[l] = x.view(s.B, s.nq, -1)
        if not verify:
            self.ws.end_step(s)
        marks.end()
        return x, aux

    def decode_core(self, lanes, rows, toks, pos, sets, recorded, cross=None, short="none", dense_slots=None):
        """One decode step for lanes [B]; rows: the lanes' rows (slice or index). Reads only device tensors, so the
        same code runs eagerly and under CUDA-graph capture. ``cross``: indices into the batch of lanes at their
        crossing step (eager only). ``short`` (``SHORT_STEPS``): "none", "some" or "all" short lanes; an all-short
        step attends the first ``dense_slots`` slots of each row (default: all ``top_k``). Returns (logits [B, V],
        aux [B, 3 * hidden] or None)."""
        if short not in SHORT_STEPS:
            raise ValueError(f"decode_core: short must be one of {SHORT_STEPS}, got {short!r}")
        all_short = short == "all"
        nq = 2 if self.cfg.mode_spec.drafts and not all_short else 1
        s = decode_step(
            lanes,
            rows,
            pos,
            nq,
            block_size=self.cfg.block_size,
            n_kv_heads=self.H,
            all_short=all_short,
            sets=sets,
            recorded=recorded,
        )
        if self.drafts.ngram is not None:  # the input tokens into the lanes' histories; the draft row's lookup
            self.drafts.ngram.step(lanes, toks, pos, look=nq == 2)
        r = self.ws.prepare(s, short, dense_slots, cross)
        ids = torch.stack([toks, self.drafts.tok[lanes]], 1).reshape(-1) if nq == 2 else toks
        x, aux = self._layers(s, r, self.dec.embed_tokens(ids), verify=False)
        logits = self.dec.logits(x.view(s.B, nq, -1)[:, 0])
        aux_t = torch.cat([aux[i][:, 0] for i in self.drafts.layers], -1) if aux else None
        return logits, aux_t

    # -- speculative steps (oasis_exec.runner.speculative) ----------------------------------------------------------

    def decode_spec(self, lanes, rows, toks, drafts, pos, sets):
        """The verification pass of a speculative step (no lane short or crossing): lanes [B], the input tokens
        ``toks`` [B] at ``pos`` and ``drafts`` [B, k] at ``pos + 1 .. pos + k``, one target pass over the ``k + 1``
        positions. Writes the input token's KV as the ordinary step does (``dense``: every position's KV into the
        pages); the drafts' KV stay out of the cache (``commit_spec`` writes the accepted ones). Returns (logits
        [B, k + 1, V], aux [B, k + 1, 3 * hidden] or None, the pass's ``DecodeStep`` for ``commit_spec``)."""
        B, k = drafts.shape
        s = decode_step(lanes, rows, pos, k + 1, block_size=self.cfg.block_size, n_kv_heads=self.H, sets=sets)
        r = self.ws.prepare_verify(s)
        x = self.dec.embed_tokens(torch.cat([toks[:, None], drafts], 1).reshape(-1))
        x, aux = self._layers(s, r, x, verify=True)
        logits = self.dec.logits(x).view(B, k + 1, -1)
        aux_t = torch.cat([aux[i] for i in self.drafts.layers], -1) if aux else None
        return logits, aux_t, s

    def spec_core(self, lanes, rows, toks, pos, drafts, lim, n_forced=None, sets=None, recorded=None):
        """A speculative step after its draft chain, all on the device (eager, or captured as one CUDA graph by
        ``DecodeGraphs``): the verification pass (``decode_spec``), greedy acceptance (``speculative.greedy_accepted``,
        at most ``lim`` [B] drafts a row) or, with ``n_forced`` [B] (benchmark-only synthetic acceptance), that
        many, the commit (``commit_spec``) and the resync (``Drafts.resync``: the next first draft from the target's
        features at the last accepted position and the token emitted last; an attending head's K/V extended by the
        accepted positions). Returns (logits [B, k + 1, V], accepted [B] int64,
        emitted tokens [B, k + 1]: a row's first ``accepted + 1`` count)."""
        logits, aux, step = self.decode_spec(lanes, rows, toks, drafts, pos, sets)
        n, tgt = greedy_accepted(logits, drafts, lim)
        if n_forced is not None:
            n = n_forced
        emitted = emitted_tokens(tgt, drafts, n)
        self.commit_spec(step, n, sets, recorded)
        self.drafts.resync(lanes, aux, emitted, n)
        if self.drafts.ngram is not None:  # the accepted drafts into the lanes' histories (prompt lookup)
            self.drafts.ngram.accepted(lanes, pos, emitted, n)
        return logits, n, emitted

    def commit_spec(self, step, n, sets, recorded) -> None:
        """After a speculative step's acceptance (``n`` [B] int64: accepted drafts a lane, on the device; no host
        synchronisation): what the mode's working set keeps of the pass ``step`` (``WorkingSet.commit``: the
        resident set writes the accepted drafts' KV and launches the next step's prediction; ``dense``'s pass wrote
        its pages already)."""
        self.ws.commit(step, n, sets, recorded)
