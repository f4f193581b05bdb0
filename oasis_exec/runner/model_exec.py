"""Model execution: the forward passes of one runner call over the KV stores (what the GPU computes).

``ModelExec`` runs a prefill chunk (``prefill``: the chunk's causal attention over the prompt so far, its summaries
and host copies; after the last chunk the first working set, ``_first_working_set``), a synthesized prefill of a
benchmark (``synthesize``) and the per-layer decode step (``decode_core``, device work only, so the same code runs
eagerly and under CUDA-graph capture; see ``runner.py`` for the order of its stages), with the top-K prediction of
a layer (``predict``). It holds the draft tokens of the lanes (``draft_tok``), each lane's host block table
(``lane_blocks``) and a chunked prefill's prompt KV (``scratch``); ``propose`` / ``propose_prefill`` write the
draft head's next tokens once the runner has sampled.

Short contexts (``short``, an ``oasis_core.short_context.ShortContext``; None: off): a lane whose context fits its
resident set has no host blocks. Its prefill writes its KV into its resident slots and summaries only. The runner
decides per step, on the host from the positions, how many lanes can be short (``decode_core``'s ``short``):

- "all": the resident-dense step. One query per lane (no draft token), attention over the lane's slots (which hold
  every block of its context), summaries kept; no scoring, top-K, selection, fetch, write-back or step clock.
- "some": the sparse step with three per-row differences decided on the device (so a captured graph takes them
  too): a block that fills while the next step still fits is moved from the local slot into the next free
  resident slot instead of being written back (slots ``0 .. n-1`` then hold its ``n`` full blocks, as fetches
  would have placed them); nothing is written back while it fits; its rows plan with a fetch cap of 0.
- "none": the plain sparse step.

On-demand modes (retrieval, hisparse) predict each layer's top-K from the step's own query and fetch it on the main
stream before that layer attends (``Prefetcher.fetch_now``). A hot cache (hisparse: ``S = hot_slots > K`` slots a
row) then attends only the step's top-K: the slot of each predicted block after the fetch (``plan_select``'s
``slots_out`` on CUDA, ``SparseStore.selected_slots`` otherwise), not every slot of the row.

Speculative steps (``oasis_exec.runner.speculative``): ``draft_chain`` drafts ``k`` tokens a lane, ``decode_spec`` is the
verification pass over ``k + 1`` positions and ``commit_spec`` keeps what the accepted tokens wrote (device-side
masks, no host list) and launches the lookahead prediction for the next step; ``spec_core`` is the pass, the
device-side acceptance, the commit and the resync in one capturable call.

At its crossing step (eager, see ``Runner._cross``) each layer first copies the lane's GPU blocks to its host blocks
with the write-back kernel (``_offload``, on the stream, no host synchronisation), and that step fetches its rows'
top-K from the real query (the one block not resident, the newest full one, comes from the copy just made) before
attending (background modes: their prediction of the step before had no host copy to fetch from).

An fp8 host copy (``ExecConfig.host_kv_dtype="fp8_e4m3"``, ``oasis_exec.kv.host_quant``) is quantized where it is
written: the prefill's host copies (``HostPool.write``), the write-back of filled blocks and the crossing's offload
(the write-back kernel); it is dequantized where it is read (the transfer paths), so the slots stay in the compute
dtype. Blocks that become resident without a fetch -- the first working set after a prefill, a crossing lane's
blocks -- are rounded through the same quantization, so every resident non-local slot holds what its host copy
reads back as; the local block and a short lane's blocks (no host copy yet) stay exact.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from oasis_core.scoring import topk_blocks
from oasis_core.selection import initial_plan

from ..kv.host_quant import roundtrip
from ..kv.layer_table import table
from ..kv.ring import RingKV, ring_extra
from ..transfer.writeback import writeback_full
from . import ops
from .speculative import emitted_tokens, greedy_accepted

SHORT_STEPS = ("none", "some", "all")  # decode_core's ``short``: how many of the step's lanes can be short


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


@dataclass
class DecodeStep:
    """What every layer of a decode step reads (``ModelExec.decode_core``), made once a step: the lanes [B], their
    rows and positions, the queries a lane (``nq``: 2 with the draft token), the step's drawn or replayed sets, block
    counts now and next step, the local block's valid tokens [B]; the summary / write-back items [B * H] (row, block,
    valid tokens, source slot or page) and the new token's offset in its block; a paged step's pages ``page_cur``."""

    lanes: torch.Tensor
    rows: object
    pos: torch.Tensor
    B: int
    nq: int
    all_short: bool
    sets: object
    recorded: object
    hh: torch.Tensor
    lanes32: torch.Tensor
    nb_cur: torch.Tensor
    nb_next: torch.Tensor
    local_len: torch.Tensor
    item_row: torch.Tensor
    item_blk: torch.Tensor
    item_len: torch.Tensor
    item_src: torch.Tensor | None = None
    off32: torch.Tensor | None = None
    page_cur: torch.Tensor | None = None


@dataclass
class ResidentRows:
    """A resident step's per-row tensors: slot bases [B, H], local slots, the selectable slots' offsets [S], the
    write-back's valid lengths and host destinations [B * H]; with short lanes (``short`` "some" / "all") their
    slot tables (``in_order`` [B, S], ``sr``, ``res_short``, ``ls_short``) or, all short, the slots attended in every
    layer (``slot_ids_all``); at a crossing step the crossing lanes (``ci``, ``c_lanes``, ``c_rows``, ``c_items``)."""

    base: torch.Tensor
    local_slot: torch.Tensor
    sel_off: torch.Tensor
    wb_len: torch.Tensor
    item_dst: torch.Tensor | None = None
    in_order: torch.Tensor | None = None
    slot_ids_all: torch.Tensor | None = None
    sr: torch.Tensor | None = None
    res_short: torch.Tensor | None = None
    ls_short: torch.Tensor | None = None
    ci: torch.Tensor | None = None
    c_lanes: torch.Tensor | None = None
    c_rows: torch.Tensor | None = None
    c_items: tuple | None = None


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
            me.pipe.trace = []
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
                ev += me.pipe.trace
                me.pipe.trace = None
            tr.layer_events += [[tr.step, l, k_, 1e3 * (a - t0), 1e3 * (b - t0)] for k_, l, a, b in ev]


class ModelExec:
    def __init__(
        self,
        *,
        cfg,
        decoder,
        draft,
        store,
        host,
        pipe,
        caps,
        trace: StepTrace,
        max_lanes: int,
        device: torch.device,
        dtype: torch.dtype,
        short=None,
    ):
        self.cfg, self.mode, self.device, self.dtype = cfg, cfg.mode_spec, device, dtype
        self.dec, self.draft, self.shape = decoder, draft, decoder.shape
        self.store, self.host, self.pipe, self.caps, self.trace = store, host, pipe, caps, trace
        s = decoder.shape
        self.bs, self.H, self.L, self.K = cfg.block_size, s.n_kv_heads, s.n_layers, cfg.top_k
        self.lane_blocks = {}  # lane -> host block ids (sparse modes)
        self.draft_tok = torch.zeros(max_lanes, dtype=torch.int64, device=device)
        self.scratch = {}  # req_id -> (k [L, H, T, D], v) during a real prefill (sparse modes; full layers only)
        self.capturing = False  # set by DecodeGraphs while a step is captured
        self.short = short
        # sliding-window layers (ModelSpec.layer_windows): their KV in a ring a lane, dense attention (kv/ring.py)
        self.ring = RingKV(s, max_lanes, ring_extra(cfg), dtype, device) if s.is_hybrid else None
        # speculative decoding (oasis_exec.runner.speculative): the draft head's hidden state behind each lane's draft token
        self.draft_h = None
        if cfg.spec_max_k:
            self.draft_h = torch.zeros(max_lanes, decoder.shape.hidden, dtype=dtype, device=device)
        self.draft_attends = getattr(draft, "attends", False)  # oasis_exec.model.draft_attn: K/V of every position
        if self.draft_attends:
            draft.allocate(max_lanes)

    def synthesize(self, a) -> None:
        """KV of positions 0..prompt_len-2 filled with random values; the last prompt token decodes first."""
        n_tok = a.prompt_len - 1
        n_full = n_tok // self.bs
        g = torch.Generator(device=self.device).manual_seed(a.seed)
        st = self.store
        for l in self._paged_layers():  # a sliding layer has no summaries (its ring is filled below)
            if st.kmin is not None:
                base = torch.randn(self.H, n_full, self.shape.head_dim, generator=g, device=self.device)
                st.kmin[l, a.lane, :, :n_full] = (base - 1.0).to(self.dtype)
                st.kmax[l, a.lane, :, :n_full] = (base + 1.0).to(self.dtype)
        if self.cfg.sparse:
            lane = torch.tensor([a.lane], device=self.device)
            slots = (st.slot_base(lane)[0][:, None] + torch.arange(st.W, device=self.device)).reshape(-1)
            for l in self._paged_layers():
                st.k[l][slots] = torch.randn(
                    slots.numel(), self.bs, self.shape.head_dim, generator=g, device=self.device
                ).to(self.dtype)
                st.v[l][slots] = torch.randn(
                    slots.numel(), self.bs, self.shape.head_dim, generator=g, device=self.device
                ).to(self.dtype)
                # Initial working set: the first K eligible blocks (replaced by the synthetic set when used).
                k = min(self.K, max(n_full, 0))
                rows = slice(a.lane * self.H, (a.lane + 1) * self.H)
                st.resident[l, rows, :k] = torch.arange(k, device=self.device)
                st.last_sel[l, rows, :k] = 0
        else:
            pages = torch.arange(a.lane * st.P, a.lane * st.P + -(-a.prompt_len // self.bs), device=self.device)
            for l in self._paged_layers():
                st.k[l][pages] = torch.randn(
                    pages.numel(), self.H, self.bs, self.shape.head_dim, generator=g, device=self.device
                ).to(self.dtype)
                st.v[l][pages] = torch.randn(
                    pages.numel(), self.H, self.bs, self.shape.head_dim, generator=g, device=self.device
                ).to(self.dtype)
        if self.ring is not None:  # the sliding layers' windows: random too
            for l in self.ring.windows:
                self.ring.k[l][a.lane] = torch.randn(self.ring.k[l][a.lane].shape, generator=g, device=self.device)
                self.ring.v[l][a.lane] = torch.randn(self.ring.v[l][a.lane].shape, generator=g, device=self.device)
        self.draft_tok[a.lane] = 0
        if self.draft_attends:
            self.draft.synthesize(a.lane, a.prompt_len - 1, a.seed)

    def _paged_layers(self) -> list:
        """The layers with slots or pages (every layer but a hybrid model's sliding ones, which keep rings)."""
        return [l for l in range(self.L) if self.ring is None or not self.ring.has(l)]

    def prefill(self, ch):
        """One chunk of a real prefill (``RunnerCall.prefill``). Returns None before the last chunk, else
        (logits [1, V] of the last prompt token, the draft head's hidden states {layer: [hidden]})."""
        dev, bs, H, D = self.device, self.bs, self.H, self.shape.head_dim
        n = len(ch.tokens)
        start, end = ch.start, ch.start + n
        pos = torch.arange(start, end, device=dev)
        x = self.dec.embed_tokens(torch.tensor(ch.tokens, device=dev))
        sparse = self.cfg.sparse
        short_lane = sparse and self.short is not None and not self.lane_blocks[ch.lane]  # no host blocks: short
        if sparse and ch.req_id not in self.scratch:
            tpad = self.cfg.max_blocks * bs
            held = self._paged_layers()  # a sliding layer's prompt KV goes to its ring only
            self.scratch[ch.req_id] = tuple(
                table(self.L, held, (H, tpad, D), 0, self.dtype, dev, "scratch") for _ in range(2)
            )
        aux, q_last = {}, []
        layers_aux = self.draft.layers if self.draft is not None else ()
        st = self.store
        full_lo, full_hi = start // bs, end // bs  # blocks completed by this chunk: [full_lo, full_hi)
        for l in range(self.L):
            q, k, v = self.dec.qkv(l, x, pos)  # q [n, Hq, D], k/v [n, H, D]
            if self.ring is not None and self.ring.has(l):  # a sliding layer: its ring, nothing else
                q_last.append(None)  # no first working set
                x = self.dec.finish(l, x, self.ring.prefill(l, ch.lane, q, k, v, start))
                if l in layers_aux:
                    aux[l] = x if self.draft_attends else x[-1]
                continue
            if sparse:
                sk, sv = self.scratch[ch.req_id]
                sk[l, :, start:end] = k.transpose(0, 1)
                sv[l, :, start:end] = v.transpose(0, 1)
                keys, vals = sk[l, :, :end], sv[l, :, :end]
            else:
                page = ch.lane * st.P + pos // bs
                st.k[l][page, :, pos % bs] = k
                st.v[l][page, :, pos % bs] = v
                npg = -(-end // bs)
                pk = st.k[l][ch.lane * st.P : ch.lane * st.P + npg]
                pv = st.v[l][ch.lane * st.P : ch.lane * st.P + npg]
                keys = pk.permute(1, 0, 2, 3).reshape(H, -1, D)[:, :end]
                vals = pv.permute(1, 0, 2, 3).reshape(H, -1, D)[:, :end]
            attn = self._causal_attn(q, keys, vals, start)
            if full_hi > full_lo:
                kb = keys[:, full_lo * bs : full_hi * bs].reshape(H, full_hi - full_lo, bs, D)
                if st.kmin is not None:
                    a, b = ops.block_summaries(kb, self.cfg.block_score)
                    st.kmin[l, ch.lane, :, full_lo:full_hi] = a
                    st.kmax[l, ch.lane, :, full_lo:full_hi] = b
                if sparse and not short_lane:
                    vb = vals[:, full_lo * bs : full_hi * bs].reshape(H, full_hi - full_lo, bs, D)
                    phys = torch.tensor(self.lane_blocks[ch.lane][full_lo:full_hi])
                    self.host.write(l, phys, kb.transpose(0, 1), vb.transpose(0, 1))  # fp8: quantized here
            if ch.last:
                q_last.append(q[-1])
            x = self.dec.finish(l, x, attn)
            if l in layers_aux:
                aux[l] = x if self.draft_attends else x[-1]
        if self.draft_attends:  # the draft layer's K/V of the chunk's positions
            self.draft.prefill_chunk(ch.lane, start, torch.cat([aux[i] for i in layers_aux], -1), ch.tokens)
            aux = {i: a[-1] for i, a in aux.items()}
        if not ch.last:
            return None
        if sparse:
            self._first_working_set(ch, q_last, end, short_lane)
            del self.scratch[ch.req_id]
        return self.dec.logits(x[-1:]), aux

    def _causal_attn(self, q, keys, vals, start):
        """q [n, Hq, D] at positions start..; keys/vals [H, T, D] (T = start + n) -> [n, Hq, D]."""
        n, Hq, D = q.shape
        H, T, _ = keys.shape
        G = Hq // H
        qh = q.transpose(0, 1).reshape(H, G * n, D)
        mask = torch.arange(T, device=q.device)[None, :] <= (start + torch.arange(n, device=q.device))[:, None]
        mask = mask[None].expand(G, n, T).reshape(G * n, T)
        sc = torch.einsum("hqd,htd->hqt", qh.float(), keys.float()) / math.sqrt(D)
        sc = sc.masked_fill(~mask, -math.inf)
        o = torch.einsum("hqt,htd->hqd", torch.softmax(sc, -1), vals.float())
        return o.reshape(Hq, n, D).transpose(0, 1).to(q.dtype)

    def _first_working_set(self, ch, q_last, n_tok, short_lane=False) -> None:
        """Local block from the prompt's tail; the first step's top-K from the last prompt token's query. A short
        lane instead holds block j in its slot j, the tail included (``decode_core``'s placement): with K + 1 full
        blocks (a prompt of exactly the window) block K is in the local slot, where the crossing (the next step)
        finds it."""
        st, bs, H, dev = self.store, self.bs, self.H, self.device
        sk, sv = self.scratch[ch.req_id]
        lane = torch.tensor([ch.lane], device=dev)
        base = st.slot_base(lane)[0]  # [H]
        rows = slice(ch.lane * H, (ch.lane + 1) * H)
        if short_lane:
            n_slots = -(-n_tok // bs)  # blocks holding the prompt, the partial tail included; at most K + 1
            for l in range(self.L):
                if q_last[l] is None:  # a sliding layer: its ring
                    continue
                kb = torch.zeros(H, n_slots * bs, sk.shape[-1], dtype=sk.dtype, device=dev)
                vb = torch.zeros_like(kb)
                kb[:, :n_tok], vb[:, :n_tok] = sk[l, :, :n_tok], sv[l, :, :n_tok]
                dst = (base[:, None] + torch.arange(n_slots, device=dev)).reshape(-1)
                st.k[l][dst] = kb.view(H * n_slots, bs, -1)
                st.v[l][dst] = vb.view(H * n_slots, bs, -1)
                n_full = min(n_tok // bs, self.K)
                st.resident[l, rows, :n_full] = torch.arange(n_full, device=dev)
                st.last_sel[l, rows, :n_full] = 0
            return
        tail0 = (n_tok // bs) * bs
        nb = tail0 // bs + 1  # blocks incl. the (possibly empty) local one
        for l in range(self.L):
            if q_last[l] is None:  # a sliding layer: its ring
                continue
            m = n_tok - tail0
            if m:
                st.k[l][base + st.LOCAL, :m] = sk[l, :, tail0:n_tok]
                st.v[l][base + st.LOCAL, :m] = sv[l, :, tail0:n_tok]
            scores = ops.block_score(
                q_last[l][None],
                st.kmin[l],
                st.kmax[l],
                torch.tensor([nb], dtype=torch.int32, device=dev),
                lane.to(torch.int32),
                self.cfg.block_score,
            )
            pred = topk_blocks(scores.view(H, -1), self.K, torch.full((H,), nb, device=dev))  # [H, K]
            plan = initial_plan(pred, step=0, slots=st.S)  # the first K slots; a hot cache's others start empty
            st.resident[l, rows] = plan.resident
            st.last_sel[l, rows] = plan.last_sel
            blk = plan.resident[:, : self.K].clamp(min=0)  # [H, K]: fetch_slot j == j
            tok = blk[:, :, None] * bs + torch.arange(bs, device=dev)  # [H, K, bs]
            kk = torch.gather(sk[l], 1, tok.reshape(H, -1, 1).expand(-1, -1, sk.shape[-1]))
            vv = torch.gather(sv[l], 1, tok.reshape(H, -1, 1).expand(-1, -1, sv.shape[-1]))
            dst = (base[:, None] + torch.arange(self.K, device=dev)).reshape(-1)
            kk, vv = kk.reshape(H * self.K, bs, -1), vv.reshape(H * self.K, bs, -1)
            if self.host.quantized:  # what the host copy reads back as (the prefill just wrote it quantized)
                kk, vv = roundtrip(kk), roundtrip(vv)
            st.k[l][dst] = kk
            st.v[l][dst] = vv

    def decode_core(self, lanes, rows, toks, pos, sets, recorded, cross=None, short="none", dense_slots=None):
        """One decode step for lanes [B]; rows: the lanes' rows (slice or index). Reads only device tensors, so the
        same code runs eagerly and under CUDA-graph capture. ``cross``: indices into the batch of lanes at their
        crossing step (eager only). ``short`` (the runner decides it on the host from the positions, ``SHORT_STEPS``):
        "none": no lane of the step can be short, the plain sparse step; "some": some may be, the step carries the
        short-context masks; "all": every lane is short, the resident-dense step (no draft token, no prediction, no
        selection, no fetch, no write-back), attending the first ``dense_slots`` slots of each row (default: all
        ``top_k``; the runner passes a bucket of the longest lane's full blocks). Returns (logits [B, V], aux
        [B, 3 * hidden]).

        The step's tensors every layer reads are made once (``_step_inputs``, then ``_resident_rows`` or
        ``_paged_rows``); each layer runs its mode family's body, ``_layer_resident`` (the KV in host memory, a
        working set of slots on the GPU) or ``_layer_paged`` (dense, quest: the whole KV on the GPU)."""
        if short not in SHORT_STEPS:
            raise ValueError(f"decode_core: short must be one of {SHORT_STEPS}, got {short!r}")
        cfg = self.cfg
        s, x, positions = self._step_inputs(lanes, rows, toks, pos, sets, recorded, short)
        r = self._resident_rows(s, pos, short, dense_slots, cross) if cfg.sparse else self._paged_rows(s, pos)
        layer = self._layer_resident if cfg.sparse else self._layer_paged
        marks = _LayerMarks(self)
        aux = {}
        layers_aux = self.draft.layers if self.draft is not None else ()
        for l in range(self.L):
            marks.begin()
            q, k, v = self.dec.qkv(l, x, positions)
            q = q.view(s.B, s.nq, q.shape[1], -1)
            k = k.view(s.B, s.nq, self.H, -1)
            v = v.view(s.B, s.nq, self.H, -1)
            ring = self.ring is not None and self.ring.has(l)  # a sliding layer, every mode: its ring, nothing else
            x = self.dec.finish(l, x, self._layer_ring(l, s, q, k, v, positions) if ring else layer(l, s, r, q, k, v))
            if l in layers_aux:
                aux[l] = x.view(s.B, s.nq, -1)[:, 0]
        if cfg.sparse:
            if not s.all_short:
                self.caps.step_end()
            self.pipe.zero_rows = None
        marks.end()
        logits = self.dec.logits(x.view(s.B, s.nq, -1)[:, 0])
        aux_t = torch.cat([aux[i] for i in layers_aux], -1) if layers_aux else None
        return logits, aux_t

    def _step_inputs(self, lanes, rows, toks, pos, sets, recorded, short):
        """The decode step's inputs every layer reads (``DecodeStep``), its embedded tokens and their positions
        (a lane's token, then its draft token when the mode drafts and the step is not resident-dense)."""
        cfg, dev, bs, H = self.cfg, self.device, self.bs, self.H
        all_short = short == "all"
        B = lanes.shape[0]
        nq = 2 if self.mode.drafts and not all_short else 1
        if nq == 2:
            ids = torch.stack([toks, self.draft_tok[lanes]], 1).reshape(-1)
            positions = torch.stack([pos, pos + 1], 1).reshape(-1)
        else:
            ids, positions = toks, pos
        if cfg.sparse and not all_short:
            self.caps.step_start()  # the step clock an adaptive fetch policy reads (nothing for a static one)
        x = self.dec.embed_tokens(ids)
        local_len = (pos % bs + 1).to(torch.int32)
        hh = torch.arange(H, device=dev)
        s = DecodeStep(
            lanes=lanes,
            rows=rows,
            pos=pos,
            B=B,
            nq=nq,
            all_short=all_short,
            sets=sets,
            recorded=recorded,
            hh=hh,
            lanes32=lanes.to(torch.int32),
            nb_cur=pos // bs + 1,  # blocks of the context incl. the local block (which holds ``pos``)
            nb_next=(pos + 1) // bs + 1,
            local_len=local_len,
            item_row=(lanes[:, None] * H + hh).reshape(-1).to(torch.int32),  # summary / write-back items [B * H]
            item_blk=(pos // bs).repeat_interleave(H).to(torch.int32),
            item_len=local_len.repeat_interleave(H),
        )
        return s, x, positions

    def _paged_rows(self, s, pos):
        """A paged step's items (dense, quest): the new token's page, its items' source pages and block offset."""
        st, bs = self.store, self.bs
        s.page_cur = s.lanes * st.P + pos // bs
        s.item_src = (s.page_cur[:, None] * self.H + s.hh).reshape(-1).to(torch.int32)
        s.off32 = (pos % bs).to(torch.int32)  # the new token's offset in its block
        return None

    def _resident_rows(self, s, pos, short, dense_slots, cross):
        """A resident step's per-row tensors (``ResidentRows``): slot bases, local slots, the short lanes' slot
        tables (``short`` "some" / "all"), the write-back's destinations, the crossing lanes' offload items."""
        dev, st, bs, H, hh, lanes = self.device, self.store, self.bs, self.H, s.hh, s.lanes
        base = st.slot_base(lanes)  # [B, H]
        r = ResidentRows(
            base=base, local_slot=base + st.LOCAL, sel_off=torch.arange(st.S, device=dev), wb_len=s.item_len
        )
        if self.short is not None and short != "none":
            # A short lane's block j lives in its slot j (its newest, partial block too; block K is the local
            # slot), so nothing moves as it grows: its full blocks are slots 0 .. pos // bs - 1.
            short_lane = pos + 1 <= self.short.window_tokens  # [B] resident-dense this step
            short_row = short_lane.repeat_interleave(H)
            r.local_slot = torch.where(short_lane[:, None], base + (pos // bs)[:, None], r.local_slot)
            r.in_order = torch.where(r.sel_off < (pos // bs)[:, None], r.sel_off, -1)  # [B, S] block of each slot
            r.wb_len = torch.where(short_row, torch.zeros_like(s.item_len), s.item_len)  # nothing to the host yet
            self.pipe.zero_rows = None if s.all_short else short_row  # planned with cap 0 (nothing fetched)
            if s.all_short:  # the same slots in every layer; only the first dense_slots can hold a full block
                n = st.S if dense_slots is None else dense_slots
                ids = torch.where(r.in_order[:, None, :n] >= 0, base[:, :, None] + r.sel_off[:n], -1)
                r.slot_ids_all = ids.to(torch.int32)
            else:
                r.sr = short_row[:, None]
                r.res_short = r.in_order.repeat_interleave(H, 0)  # [B * H, S]
                r.ls_short = torch.where(r.res_short >= 0, 0, -1)
        s.item_src = r.local_slot.reshape(-1).to(torch.int32)
        phys = st.host_table[lanes, pos // bs]  # host block of each lane's local block
        r.item_dst = (phys[:, None] * H + hh).reshape(-1).to(torch.int32)
        if cross is not None:
            r.ci = torch.tensor(cross, device=dev)
            r.c_lanes = lanes[r.ci]
            r.c_rows = (r.c_lanes[:, None] * H + hh).reshape(-1)
            r.c_items = self._offload_items(r.c_lanes)
        s.off32 = (pos % bs).to(torch.int32)  # the new token's offset in its block
        return r

    def _layer_resident(self, l, s, r, q, k, v):
        """Layer ``l`` of a resident step (retrieval, proxy, lookahead, hisparse; the victim cache): wait for this
        layer's background copies, write the token's KV, fetch on demand (on-demand modes, the crossing lanes),
        attend the row's slots and the local block, summarize and write back the local block, then launch the next
        step's prediction (background modes). Returns attn [B * nq, Hq, D]."""
        st, mode, rows, all_short = self.store, self.mode, s.rows, s.all_short
        self.pipe.wait(l)
        if r.in_order is not None and not all_short:  # short rows' tables: their blocks in slot order
            st.resident[l][rows] = torch.where(r.sr, r.res_short, st.resident[l][rows])
            st.last_sel[l][rows] = torch.where(r.sr, r.ls_short, st.last_sel[l][rows])
        if r.ci is not None:  # crossing lanes: their KV so far to the host, before the local slot is reused
            self._offload(l, r.c_rows, *r.c_items)
        fused_kv = self.cfg.fused_ops and self.cfg.fused_kv_write
        ops.kv_write(k[:, 0], v[:, 0], st.k[l], st.v[l], s.item_src, s.off32, fused_kv)
        if r.ci is not None and not mode.on_demand:  # the crossing lanes' first top-K, fetched now
            pred = self.predict(l, q[r.ci, 0], s.lanes32[r.ci], s.nb_cur[r.ci], None)
            self.pipe.fetch_now(l, pred, r.c_lanes, r.c_rows)
        if mode.on_demand and not all_short:
            given = s.sets[0][:, l] if s.sets is not None else None
            pred = self.predict(l, q[:, 0], s.lanes32, s.nb_cur, given, s.recorded)
            hot_ids = self.pipe.fetch_now(l, pred, s.lanes, rows, slots=mode.hot_cache)
        if r.slot_ids_all is not None:
            slot_ids = r.slot_ids_all
        elif mode.hot_cache and not all_short:  # the step's top-K inside the hot cache, not all its slots
            slot_ids = (
                hot_ids.view(s.B, self.H, -1) if hot_ids is not None else st.selected_slots(l, rows, pred, r.base)
            )
        else:
            slot_ids = self._resident_slot_ids(l, rows, r.base, r.sel_off)
        attn, _, _ = self._attend(l, q, k, v, slot_ids, r.local_slot, s.local_len)
        # The local block's summary (exact for its valid tokens) and, once full, its host copy.
        self._summarize(l, s.item_src, s.item_row, s.item_blk, s.item_len)
        if not all_short:
            writeback_full(
                st.k[l],
                st.v[l],
                self.host.k[l],
                self.host.v[l],
                s.item_src,
                r.item_dst,
                r.wb_len,
                self.bs,
                self._scales(l),
            )
        if mode.background and not all_short:
            given = None if s.sets is None else (s.sets[1] if mode.drafts else s.sets[2])[:, l]
            self._launch_prediction(l, q[:, s.nq - 1], given, s.lanes, s.lanes32, s.nb_next, rows, s.sets, s.recorded)
        return attn

    def _layer_ring(self, l, s, q, k, v, positions):
        """Layer ``l`` of a hybrid model's sliding window (``oasis_exec.kv.ring``): every query row's KV into the
        lane's ring (a draft row's too: the real token rewrites its slot the next step), then dense attention over
        the window. Returns attn [B * nq, Hq, D]."""
        p2 = positions.view(s.B, s.nq)
        self.ring.write(l, s.lanes, p2, k, v)
        return self.ring.attend(l, q, s.lanes, p2).reshape(s.B * s.nq, q.shape[2], -1)

    def _layer_paged(self, l, s, r, q, k, v):
        """Layer ``l`` of a paged step (dense: paged attention over the lane's pages; quest: the top-K pages by the
        summaries, then the local page's summary). Returns attn [B, Hq, D]."""
        st, bs, B = self.store, self.bs, s.B
        fused_kv = self.cfg.fused_ops and self.cfg.fused_kv_write
        kf, vf = st.k[l].view(-1, bs, st.D), st.v[l].view(-1, bs, st.D)
        ops.kv_write(k[:, 0], v[:, 0], kf, vf, s.item_src, s.off32, fused_kv)
        if not self.mode.selects:
            attn = ops.paged_attn(
                q[:, 0].contiguous(), st.k[l], st.v[l], st.block_table[s.lanes], (s.pos + 1).to(torch.int32)
            )
            return attn.reshape(B, q.shape[2], -1)
        given = s.sets[0][:, l] if s.sets is not None else None  # quest
        ids_ = self.predict(l, q[:, 0], s.lanes32, s.nb_cur, given, s.recorded).view(B, self.H, -1)
        pg = s.lanes[:, None, None] * st.P + ids_.clamp(min=0)
        slot_ids = torch.where(ids_ >= 0, pg * self.H + s.hh[None, :, None], -1).to(torch.int32)
        lslot = (s.page_cur[:, None] * self.H + s.hh).to(torch.int32)
        attn = ops.sparse_attn(q[:, 0][:, :, None], kf, vf, slot_ids, lslot, s.local_len)[:, :, 0]
        ops.summary_update(
            kf,
            s.item_src,
            s.item_row,
            s.item_blk,
            s.item_len,
            st.kmin[l].view(-1, st.P, st.D),
            st.kmax[l].view(-1, st.P, st.D),
            self.cfg.block_score,
        )
        return attn

    def _launch_prediction(self, l, qsel, given, lanes, lanes32, nb_next, rows, sets, recorded) -> None:
        """Layer ``l``'s background prediction -> selection -> transfer for the next step (``Prefetcher.launch``),
        started once the main stream reaches this point: query ``qsel`` [B, Hq, D], the step's drawn or replayed
        sets for it ``given`` (or None), the next step's block counts ``nb_next``. On CUDA the tensors the side
        stream reads are handed across (``Prefetcher._cross_stream``)."""
        after = None
        if self.device.type == "cuda" and self.pipe.cuda:
            after = torch.cuda.Event()
            after.record()
            extra = tuple(t for t in (sets, self.pipe.zero_rows) if t is not None)
            self.pipe._cross_stream(self.pipe.s_pred, qsel, lanes, lanes32, nb_next, *extra)
        self.pipe.launch(l, after, lambda: self.predict(l, qsel, lanes32, nb_next, given, recorded), lanes, rows)

    def _resident_slot_ids(self, l, rows, base, sel_off):
        """The slots layer ``l``'s attention reads in a background mode, int32 [B, H, K']: every resident slot
        (``S == K``, the paper's working set), or with a victim cache (``S > K``: ``ExecConfig.hot_slots``) the ``K``
        most recently selected resident slots of each row (``ops.attend_slots``, one launch)."""
        st = self.store
        B, H = base.shape
        if st.S > self.K:
            ids = self.pipe.row_ids(rows)
            return ops.attend_slots(st.resident[l], st.last_sel[l], ids, self.K, st.W).view(B, H, self.K)
        res = st.resident[l][rows].view(B, H, st.S)
        return torch.where(res >= 0, base[:, :, None] + sel_off, -1).to(torch.int32)

    def _attend(self, l, q, k, v, slot_ids, local_slot, local_len):
        """Sparse attention of layer ``l``: queries ``q`` [B, nq, Hq, D] over each row's slots ``slot_ids`` and its
        local block, positions 1.. also over the earlier positions' own KV (``k``/``v`` [B, nq, H, D]: draft or
        verified positions, not in the cache). Returns (attn [B * nq, Hq, D], their KV [B, H, nq - 1, D] or None x2)."""
        st = self.store
        B, nq, Hq = q.shape[0], q.shape[1], q.shape[2]
        ek = ev = None
        if nq > 1:
            ek = k[:, 1:].transpose(1, 2).contiguous()
            ev = v[:, 1:].transpose(1, 2).contiguous()
        attn = ops.sparse_attn(
            q.transpose(1, 2), st.k[l], st.v[l], slot_ids, local_slot.to(torch.int32), local_len, ek, ev
        )  # [B, Hq, nq, D]
        return attn.transpose(1, 2).reshape(B * nq, Hq, -1), ek, ev

    def _summarize(self, l, item_src, item_row, item_blk, item_len) -> None:
        """Layer ``l``'s summaries of the items' blocks (``ops.summary_update``: exact for their valid tokens)."""
        st = self.store
        kmin, kmax = st.kmin[l].view(-1, st.NB, st.D), st.kmax[l].view(-1, st.NB, st.D)
        ops.summary_update(st.k[l], item_src, item_row, item_blk, item_len, kmin, kmax, self.cfg.block_score)

    def _offload_items(self, lanes):
        """The crossing lanes' copy items, the same in every layer: the slots of their rows' blocks 0 .. K (block j
        in slot j, block K in slot K: the local slot when ``S == K``, a hot-cache slot when ``S > K``; ``decode_core``'s
        placement for short lanes) and those blocks' host units. Returns (src, dst) int32 [C * H * (K + 1)]."""
        st, H, dev = self.store, self.H, self.device
        C = lanes.shape[0]
        j = torch.arange(self.K + 1, device=dev)  # slot j holds block j (slot K == S is the local slot when S == K)
        rows = (lanes[:, None] * H + torch.arange(H, device=dev)).reshape(-1)  # [C * H]
        src = rows[:, None] * st.W + j  # [C * H, K + 1]
        blk = st.host_table[lanes][:, : self.K + 1].repeat_interleave(H, 0)  # [C * H, K + 1] host blocks
        dst = blk * H + torch.arange(H, device=dev).repeat(C)[:, None]
        return src.reshape(-1).to(torch.int32), dst.reshape(-1).to(torch.int32)

    def _offload(self, l, c_rows, src, dst) -> None:
        """Layer ``l`` of a crossing: the crossing rows' ``K + 1`` GPU blocks copied to their host units by the
        write-back kernel, on the current stream (no host synchronisation; the fetches later in the step and the next
        steps' background copies are ordered after it), and their tables set to blocks 0 .. n-1 in slots
        0 .. n-1, ``n = min(S, K + 1)``: K, or with a hot cache (``S > K``) also block K, which stays in its slot (a
        short lane's tables are not kept while every lane of a step is short)."""
        st, bs = self.store, self.bs
        full = torch.full_like(src, bs)
        sc = self._scales(l)  # fp8: the slots keep what the host copy reads back as (roundtrip)
        writeback_full(
            st.k[l], st.v[l], self.host.k[l], self.host.v[l], src, dst, full, bs, sc, roundtrip=sc is not None
        )
        j = torch.arange(st.S, device=self.device)
        held = j < min(st.S, self.K + 1)
        st.resident[l][c_rows] = torch.where(held, j, -1)
        st.last_sel[l][c_rows] = torch.where(held, 0, -1)

    def _scales(self, l):
        """``(k_scale, v_scale)`` of layer ``l`` of an fp8 host pool (``writeback_full``'s ``scales``), else None."""
        h = self.host
        return (h.k_scale[l], h.v_scale[l]) if h.quantized else None

    def predict(self, l, qsel, lanes32, n_blocks, src, recorded=None):
        """The top-K blocks per row [B * H, K] of layer ``l``: scored from ``qsel`` [B, Hq, D] against the summaries
        (always run, so synthetic runs pay for it), then taken from the selection source (``synthetic_topk``: the
        top-K of the scores is run for synthetic sets too, as selection=model runs it)."""
        st = self.store
        scores = ops.block_score(
            qsel.contiguous(), st.kmin[l], st.kmax[l], n_blocks.to(torch.int32), lanes32, self.cfg.block_score
        )
        B = qsel.shape[0]
        rows = scores.view(B * self.H, -1)
        if src is not None:
            pred = src.reshape(B * self.H, -1)
            if self.cfg.synthetic_topk:  # the work selection=model does here; its result is not used
                self._topk(rows, n_blocks)
        else:
            pred = self._topk(rows, n_blocks)
        if recorded is not None:
            recorded.append(pred)
        return pred

    def _topk(self, scores, n_blocks):
        """The top-K block ids [B * H, K] of ``scores`` [B * H, N] (``ExecConfig.topk_kernel``: the torch sort of
        ``oasis_core.scoring.topk_blocks``, or ``oasis_kernels.topk_select``'s one launch; the same ids)."""
        if self.cfg.topk_kernel == "fused":
            return ops.topk_select(scores, self.K, n_blocks, self.H)
        return topk_blocks(scores, self.K, n_blocks.repeat_interleave(self.H))

    def propose_prefill(self, lane: int, aux, tok) -> None:
        """The draft token of ``lane`` after its prefill's sampled token ``tok`` [1] (``aux``: ``prefill``'s)."""
        feats = torch.cat([aux[i] for i in self.draft.layers])[None]
        if self.draft_attends:
            self.draft_tok[lane] = self.draft.propose_lanes([lane], feats, tok)[0]
            return
        if self.draft_h is not None:
            d, h = self.draft.propose_state(feats, tok)
            self.draft_tok[lane], self.draft_h[lane] = d[0], h[0].to(self.draft_h.dtype)
            return
        self.draft_tok[lane] = self.draft.propose(feats, tok)[0]

    def propose(self, lanes, aux, tok) -> None:
        """The draft tokens of the step's lanes (a list, or a device tensor: no host copy, capturable) after its
        sampled tokens ``tok`` [B] (``aux``: ``decode_core``'s)."""
        idx = lanes if torch.is_tensor(lanes) else torch.tensor(lanes, device=self.device)
        if self.draft_attends:
            self.draft_tok[idx] = self.draft.propose_lanes(idx, aux, tok)
            return
        if self.draft_h is not None:
            d, h = self.draft.propose_state(aux, tok)
            self.draft_tok[idx], self.draft_h[idx] = d, h.to(self.draft_h.dtype)
            return
        self.draft_tok[idx] = self.draft.propose(aux, tok)

    # -- speculative steps (oasis_exec.runner.speculative) -----------------------------------------------------------------

    def draft_chain(self, lanes, toks, pos, k: int):
        """The ``k`` drafts [B, k] of a speculative step at positions ``pos + 1 .. pos + k`` (``toks`` [B] at
        ``pos``): the draft token proposed after the previous step, then ``k - 1`` steps of the head on its own
        hidden state (``DraftHead.chain``)."""
        d = self.draft_tok[lanes]
        out = [d]
        h = self.draft_h[lanes]
        for _ in range(k - 1):
            d, h = self.draft.chain(h, d)
            out.append(d)
        return torch.stack(out, 1)

    def decode_spec(self, lanes, rows, toks, drafts, pos, sets):
        """The verification pass of a speculative step (no lane short or crossing): lanes [B], the input
        tokens ``toks`` [B] at ``pos`` and ``drafts`` [B, k] at ``pos + 1 .. pos + k``, one target pass over the
        ``k + 1`` positions. Writes the input token's KV as the ordinary step does (local block, its summary, its
        host copy once full; ``dense``: every position's KV into the pages); the drafts' KV stay out of the cache
        (``commit_spec`` writes the accepted ones). Returns (logits [B, k + 1, V], aux [B, k + 1, 3 * hidden] or
        None, what ``commit_spec`` needs)."""
        cfg, dev, st, bs, H = self.cfg, self.device, self.store, self.bs, self.H
        B, k = drafts.shape
        nq = k + 1
        ids = torch.cat([toks[:, None], drafts], 1).reshape(-1)
        positions = (pos[:, None] + torch.arange(nq, device=dev)).reshape(-1)  # [B * nq], lane-major
        x = self.dec.embed_tokens(ids)
        hh = torch.arange(H, device=dev)
        fused_kv = cfg.fused_ops and cfg.fused_kv_write
        aux = {}
        layers_aux = self.draft.layers if self.draft is not None else ()
        saved = []
        if cfg.sparse:
            self.caps.step_start()
            local_len = (pos % bs + 1).to(torch.int32)
            item_row = (lanes[:, None] * H + hh).reshape(-1).to(torch.int32)
            item_blk = (pos // bs).repeat_interleave(H).to(torch.int32)
            item_len = local_len.repeat_interleave(H)
            base = st.slot_base(lanes)  # [B, H]
            local_slot = base + st.LOCAL
            sel_off = torch.arange(st.S, device=dev)
            item_src = local_slot.reshape(-1).to(torch.int32)
            phys = st.host_table[lanes, pos // bs]
            item_dst = (phys[:, None] * H + hh).reshape(-1).to(torch.int32)
            off32 = (pos % bs).to(torch.int32)
        else:
            page = lanes[:, None] * st.P + positions.view(B, nq) // bs  # [B, nq]
            rows_all = (page.reshape(-1)[:, None] * H + hh).reshape(-1).to(torch.int32)
            offs_all = (positions % bs).to(torch.int32)
            tables = st.block_table[lanes].repeat_interleave(nq, 0)
            lens = (positions + 1).to(torch.int32)
        for l in range(self.L):
            q, k_, v_ = self.dec.qkv(l, x, positions)
            Hq = q.shape[1]
            if self.ring is not None and self.ring.has(l):  # a sliding layer: every position into its ring
                p2 = positions.view(B, nq)
                self.ring.write(l, lanes, p2, k_.view(B, nq, H, -1), v_.view(B, nq, H, -1))
                attn = self.ring.attend(l, q.view(B, nq, Hq, -1), lanes, p2).reshape(B * nq, Hq, -1)
                saved.append(None)  # commit_spec: nothing to keep (a rejected draft's slot is rewritten later)
            elif cfg.sparse:
                q = q.view(B, nq, Hq, -1)
                k_ = k_.view(B, nq, H, -1)
                v_ = v_.view(B, nq, H, -1)
                self.pipe.wait(l)
                ops.kv_write(k_[:, 0], v_[:, 0], st.k[l], st.v[l], item_src, off32, fused_kv)
                slot_ids = self._resident_slot_ids(l, rows, base, sel_off)
                attn, ek, ev = self._attend(l, q, k_, v_, slot_ids, local_slot, local_len)
                self._summarize(l, item_src, item_row, item_blk, item_len)
                writeback_full(
                    st.k[l], st.v[l], self.host.k[l], self.host.v[l], item_src, item_dst, item_len, bs, self._scales(l)
                )
                saved.append((q, ek, ev))
            else:
                kf, vf = st.k[l].view(-1, bs, st.D), st.v[l].view(-1, bs, st.D)
                ops.kv_write(k_, v_, kf, vf, rows_all, offs_all, fused_kv)
                attn = ops.paged_attn(q.contiguous(), st.k[l], st.v[l], tables, lens).reshape(B * nq, Hq, -1)
            x = self.dec.finish(l, x, attn)
            if l in layers_aux:
                aux[l] = x.view(B, nq, -1)
        logits = self.dec.logits(x).view(B, nq, -1)
        aux_t = torch.cat([aux[i] for i in layers_aux], -1) if layers_aux else None
        return logits, aux_t, saved

    def spec_core(self, lanes, rows, toks, pos, drafts, lim, n_forced=None, sets=None, recorded=None):
        """A speculative step after its draft chain, all on the device (eager, or captured as one CUDA graph by
        ``DecodeGraphs``): the verification pass (``decode_spec``), greedy acceptance (``speculative.greedy_accepted``,
        at most ``lim`` [B] drafts a row) or, with ``n_forced`` [B] (benchmark-only synthetic acceptance), that
        many, the commit (``commit_spec``) and the resync (the next first draft from the target's features at the
        last accepted position and the token emitted last). Returns (logits [B, k + 1, V], accepted [B] int64,
        emitted tokens [B, k + 1]: a row's first ``accepted + 1`` count)."""
        logits, aux, saved = self.decode_spec(lanes, rows, toks, drafts, pos, sets)
        n, tgt = greedy_accepted(logits, drafts, lim)
        if n_forced is not None:
            n = n_forced
        emitted = emitted_tokens(tgt, drafts, n)
        self.commit_spec(lanes, rows, pos, n, saved, sets, recorded)
        ar = torch.arange(lanes.shape[0], device=self.device)
        self.propose(lanes, aux[ar, n], emitted[ar, n])
        return logits, n, emitted

    def commit_spec(self, lanes, rows, pos, n, saved, sets, recorded) -> None:
        """After a speculative step's acceptance (``n`` [B] int64: accepted drafts a lane, on the device; no host
        synchronisation): the accepted drafts' KV into the local block, the summary and host copy of a block they
        fill, the new local block's summary, then each layer's background prediction for the next step
        (``lookahead``; ``dense`` keeps nothing more: its pass wrote the pages). Nothing of a rejected draft is
        written: every write is masked to the accepted run (a masked-out entry rewrites what its slot held)."""
        cfg, dev, st, bs, H = self.cfg, self.device, self.store, self.bs, self.H
        if not cfg.sparse:
            return
        B = lanes.shape[0]
        k = next(sv for sv in saved if sv is not None)[0].shape[1] - 1  # a full layer's queries [B, k + 1, ...]
        j = torch.arange(1, k + 1, device=dev)
        b0 = pos // bs
        p_j = pos[:, None] + j  # [B, k]: the drafts' positions
        accepted = j <= n[:, None]
        # draft j goes to the input's block (phase 0) or, past its end, to the next block (phase 1), which reuses
        # the local slot once the full block's summary and host copy are taken (k < block_size: at most one fills)
        keep = [(accepted & (p_j // bs == b0[:, None] + ph))[:, None, :, None] for ph in (0, 1)]
        local = st.slot_base(lanes) + st.LOCAL  # [B, H]
        at = (local[:, :, None].long(), (p_j % bs)[:, None, :])  # [B, H, k]: slot and offset of each draft
        hh = torch.arange(H, device=dev)
        src = local.reshape(-1).to(torch.int32)
        row = (lanes[:, None] * H + hh).reshape(-1).to(torch.int32)
        fill = pos % bs + 1 + n  # tokens of the input's block and beyond after the run
        blk = [(b0 + ph).repeat_interleave(H).to(torch.int32) for ph in (0, 1)]
        valid = [v.repeat_interleave(H).to(torch.int32) for v in (fill.clamp(max=bs), (fill - bs).clamp(min=0))]
        wb_dst = (st.host_table[lanes, b0][:, None] * H + hh).reshape(-1).to(torch.int32)
        filled = (fill >= bs) & (pos % bs + 1 < bs)  # the run (not the input token: decode_spec copied it) filled it
        wb_len = torch.where(filled, bs, 0).repeat_interleave(H).to(torch.int32)
        sel = torch.clamp(n + 1, max=k)  # the pass's query nearest the next step's position p + n + 1
        qrow = torch.arange(B, device=dev)
        nb_next = (pos + n + 1) // bs + 1
        lanes32 = lanes.to(torch.int32)
        mode = self.mode
        for l in range(self.L):
            if saved[l] is None:  # a sliding layer (its ring holds every position already)
                continue
            q, ek, ev = saved[l]  # ek, ev [B, H, k, D]
            for ph in (0, 1):
                st.k[l][at] = torch.where(keep[ph], ek, st.k[l][at])
                st.v[l][at] = torch.where(keep[ph], ev, st.v[l][at])
                self._summarize(l, src, row, blk[ph], valid[ph])  # no-op for a row with no token in the block
                if ph == 0:  # a block filled by the run: its host copy before the slot holds the next one
                    writeback_full(
                        st.k[l], st.v[l], self.host.k[l], self.host.v[l], src, wb_dst, wb_len, bs, self._scales(l)
                    )
            if mode.background:
                given = sets[1][:, l] if sets is not None else None
                self._launch_prediction(l, q[qrow, sel], given, lanes, lanes32, nb_next, rows, sets, recorded)
        self.caps.step_end()
        self.pipe.zero_rows = None
