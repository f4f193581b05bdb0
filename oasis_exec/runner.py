"""The model runner: owns every GPU tensor and executes one ``RunnerCall`` (prefill chunk or decode step).

Decode, per layer l (sparse modes): QKV for the real token (and, in ``lookahead``, the draft token stacked behind
it) -> wait for layer l's transfer of the previous step -> write the real token's K/V into the local block ->
(``retrieval``: select and copy now, on the critical path) -> sparse attention over the resident slots + local
block (+ the draft token's own K/V for the draft query) -> flush a block that just filled (host copy, summary) ->
launch prediction -> selection -> transfer of layer l for the next step in the background (``proxy``: from the
real query; ``lookahead``: from the draft query) -> output projection and MLP.

Dense modes keep the whole cache on the GPU in pages: ``dense`` attends every token (``kernels.paged_attn``),
``quest`` attends the top-K blocks of the current query plus the local block (``kernels.sparse_attn`` over the
pages seen as slots).

Benchmarks synthesize prefill (``Admit.synthetic_prefill``): the KV of the prompt is filled with random values
(host pool pattern, random summaries and slots) rather than computed, so that many 16K-token requests start in
seconds. The real chunked-prefill path is used for correctness tests and serving.
"""
from __future__ import annotations

import contextlib
import gc
import math
import time

import torch

from oasis_core.geometry import KVGeometry
from oasis_core.scoring import topk_blocks
from oasis_core.selection import initial_plan
from oasis_core.specs import ModelSpec, get_model

from . import ops
from .config import ExecConfig
from .draft import DraftHead
from .fetch_caps import DeviceCaps
from .host_memory import host_pool_blocks
from .kv_store import DenseStore, HostPool, SparseStore
from .model import Decoder
from .pipeline import Prefetcher
from .scheduler import RunnerCall
from .selection_sources import SelectionSources
from .writeback import writeback_full

def _dtype(name):
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def _rows_of(lanes_list, H):
    """Rows of the lanes: a slice when they are contiguous (views, no copies), else an index list."""
    lo = lanes_list[0]
    if lanes_list == list(range(lo, lo + len(lanes_list))):
        return slice(lo * H, (lo + len(lanes_list)) * H)
    return torch.tensor([b * H + h for b in lanes_list for h in range(H)])


class Runner:
    def __init__(self, cfg: ExecConfig, *, shape: ModelSpec | None = None, decoder: Decoder | None = None):
        self.cfg = cfg
        self.mode = mode = cfg.mode_spec
        self.device = dev = torch.device(cfg.device)
        self.dtype = dt = _dtype(cfg.dtype)
        if decoder is None:
            fused = cfg.fused_ops and dev.type == "cuda"  # on CPU the kernels would run in Triton's interpreter
            if cfg.model_path:
                decoder = Decoder.from_path(cfg.model_path, dt, dev, fused)
            else:
                shape = shape or get_model(cfg.model)
                decoder = Decoder.build(shape, None, cfg.seed, dt, dev, fused)
        self.dec = decoder
        self.shape = s = decoder.shape
        if cfg.model_path and cfg.max_context > s.max_context_tokens:  # dummy weights have no trained positions
            raise ValueError(f"ExecConfig.max_context: {cfg.max_context} tokens exceed the model's "
                             f"{s.max_context_tokens} positions ({s.name}); pass --max-context "
                             f"{s.max_context_tokens} or less")
        self.draft = None
        if mode.drafts:
            self.draft = DraftHead.build(s, decoder.embed, cfg.draft_path, min(cfg.draft_vocab, s.vocab),
                                         cfg.seed + 1, dt, dev, lm_head=decoder.lm_head)
        bs, H, D, L = cfg.block_size, s.n_kv_heads, s.head_dim, s.n_layers
        self.bs, self.H, self.L = bs, H, L
        self.K = cfg.top_k
        NB = cfg.max_blocks
        self.geometry = geo = KVGeometry(s, block_size=bs, dtype_bytes=torch.tensor([], dtype=dt).element_size())
        if cfg.sparse:
            per_lane = SparseStore.bytes_per_lane(geo, self.K, NB)
        else:
            per_lane = DenseStore.bytes_per_lane(geo, NB, mode.summaries)
        self.lane_bytes = per_lane
        budget = cfg.kv_budget_gb * 1e9 if cfg.kv_budget_gb else None
        lanes = cfg.max_lanes or (int(budget // per_lane) if budget else 4)
        if budget is not None:
            lanes = min(lanes, int(budget // per_lane))
        if lanes < 1:
            raise ValueError(f"kv_budget_gb={cfg.kv_budget_gb}: one request needs {per_lane / 1e9:.2f} GB")
        self.max_lanes = lanes
        self.host = None
        self.host_blocks_total = 0
        if cfg.sparse:
            hb = host_pool_blocks(cfg, lanes=lanes, block_bytes=geo.bytes_per_block)  # sized for what runs, checked before pinning
            self.host = HostPool(L, hb, H, bs, D, dt, pin=dev.type == "cuda")
            self.host_blocks_total = hb
            self.store = SparseStore(L, lanes, H, self.K, bs, D, NB, dt, dev)
            self.cap_policy = cfg.cap_policy()
            self.caps = DeviceCaps(policy=self.cap_policy, top_k=self.K, n_layers=L,
                                   bytes_per_block_head=geo.bytes_per_block_head, link_bytes_per_s=cfg.link_gb_s * 1e9,
                                   device=dev)
            self.max_cap = self.caps.max_cap
            self.pipe = Prefetcher(cfg=cfg, store=self.store, host=self.host, device=dev, caps=self.caps)
        else:
            self.store = DenseStore(L, lanes, H, NB, D, bs, dt, dev, summaries=mode.summaries)
            self.pipe = None
        self.lane_blocks = {}  # lane -> host block ids (sparse modes)
        self.draft_tok = torch.zeros(lanes, dtype=torch.int64, device=dev)
        self.scratch = {}  # req_id -> (k [L, H, T, D], v) during a real prefill (sparse modes)
        self.gen = torch.Generator(device=dev).manual_seed(cfg.seed)
        # sampler(logits [rows, V], sampling params a row) -> token ids [rows]; rows are the plan's prefill
        # request, else its decode items, in order. The Engine installs its per-request-seeded sampler here.
        self.sampler = self._sample_default
        # synthetic / replayed selections and the recorded sets (selection_sources.py)
        self.sources = SelectionSources(cfg=cfg, mode=mode, store=self.store, shape=s, device=dev, n_layers=L,
                                        n_kv_heads=H, top_k=self.K, block_size=bs)
        self.decode_steps = 0
        self.graphs = {}  # batch size -> (graph, static inputs, logits, aux)
        self._capturing = False
        self._warm = set()
        self.stage_ms = {}
        # With cfg.profile, the bench sets trace_step (its index of the step about to run) on a few sampled steps;
        # those steps append [step, layer, stage, start_ms, end_ms] (ms since layer 0 began) to layer_events:
        # "layers" (main stream, stalls included), "stall", and the prefetch stages "pred", "select", "transfer".
        self.trace_step = None
        self.layer_events = []
        self._step_ref = None  # CUDA: the event layer 0 of a traced step began with

    # -- plan entry point ---------------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, plan: RunnerCall) -> dict:
        self.last_logits = {}
        if plan.admit and self.pipe is not None:
            self.pipe.wait_all()  # no background work may touch a lane being reset
        for a in plan.admit:
            self._admit(a)
        if plan.prefill is not None:
            return self._prefill(plan.prefill, plan.sampling)
        if plan.decode:
            return self._decode(plan)
        return {}

    def _admit(self, a) -> None:
        self.sources.admit(a.lane)
        if self.cfg.sparse:
            self.lane_blocks[a.lane] = list(a.host_blocks)
            self.store.reset_lane(a.lane, a.host_blocks)
        else:
            self.store.reset_lane(a.lane)
        if a.synthetic_prefill:
            self._synthesize(a)

    # -- synthesized prefill (benchmarks) -----------------------------------------------------------------------

    def _synthesize(self, a) -> None:
        """KV of positions 0..prompt_len-2 filled with random values; the last prompt token decodes first."""
        n_tok = a.prompt_len - 1
        n_full = n_tok // self.bs
        g = torch.Generator(device=self.device).manual_seed(a.seed)
        st = self.store
        for l in range(self.L):
            if st.kmin is not None:
                base = torch.randn(self.H, n_full, self.shape.head_dim, generator=g, device=self.device)
                st.kmin[l, a.lane, :, :n_full] = (base - 1.0).to(self.dtype)
                st.kmax[l, a.lane, :, :n_full] = (base + 1.0).to(self.dtype)
        if self.cfg.sparse:
            lane = torch.tensor([a.lane], device=self.device)
            slots = (st.slot_base(lane)[0][:, None] + torch.arange(st.W, device=self.device)).reshape(-1)
            for l in range(self.L):
                st.k[l][slots] = torch.randn(slots.numel(), self.bs, self.shape.head_dim, generator=g,
                                             device=self.device).to(self.dtype)
                st.v[l][slots] = torch.randn(slots.numel(), self.bs, self.shape.head_dim, generator=g,
                                             device=self.device).to(self.dtype)
                # Initial working set: the first K eligible blocks (replaced by the synthetic set when used).
                k = min(self.K, max(n_full, 0))
                rows = slice(a.lane * self.H, (a.lane + 1) * self.H)
                st.resident[l, rows, :k] = torch.arange(k, device=self.device)
                st.last_sel[l, rows, :k] = 0
        else:
            pages = torch.arange(a.lane * st.P, a.lane * st.P + -(-a.prompt_len // self.bs), device=self.device)
            for l in range(self.L):
                st.k[l][pages] = torch.randn(pages.numel(), self.H, self.bs, self.shape.head_dim, generator=g,
                                             device=self.device).to(self.dtype)
                st.v[l][pages] = torch.randn(pages.numel(), self.H, self.bs, self.shape.head_dim, generator=g,
                                             device=self.device).to(self.dtype)
        self.draft_tok[a.lane] = 0

    # -- real chunked prefill -----------------------------------------------------------------------------------

    def _prefill(self, ch, sampling) -> dict:
        dev, bs, H, D = self.device, self.bs, self.H, self.shape.head_dim
        n = len(ch.tokens)
        start, end = ch.start, ch.start + n
        pos = torch.arange(start, end, device=dev)
        x = self.dec.embed[torch.tensor(ch.tokens, device=dev)]
        sparse = self.cfg.sparse
        if sparse and ch.req_id not in self.scratch:
            tpad = self.cfg.max_blocks * bs
            self.scratch[ch.req_id] = (torch.zeros(self.L, H, tpad, D, dtype=self.dtype, device=dev),
                                       torch.zeros(self.L, H, tpad, D, dtype=self.dtype, device=dev))
        aux, q_last = {}, []
        layers_aux = self.draft.layers if self.draft is not None else ()
        st = self.store
        full_lo, full_hi = start // bs, end // bs  # blocks completed by this chunk: [full_lo, full_hi)
        for l in range(self.L):
            q, k, v = self.dec.qkv(l, x, pos)  # q [n, Hq, D], k/v [n, H, D]
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
                pk = st.k[l][ch.lane * st.P: ch.lane * st.P + npg]
                pv = st.v[l][ch.lane * st.P: ch.lane * st.P + npg]
                keys = pk.permute(1, 0, 2, 3).reshape(H, -1, D)[:, :end]
                vals = pv.permute(1, 0, 2, 3).reshape(H, -1, D)[:, :end]
            attn = self._causal_attn(q, keys, vals, start)
            if full_hi > full_lo:
                kb = keys[:, full_lo * bs: full_hi * bs].reshape(H, full_hi - full_lo, bs, D)
                if st.kmin is not None:
                    st.kmin[l, ch.lane, :, full_lo:full_hi] = kb.amin(2)
                    st.kmax[l, ch.lane, :, full_lo:full_hi] = kb.amax(2)
                if sparse:
                    vb = vals[:, full_lo * bs: full_hi * bs].reshape(H, full_hi - full_lo, bs, D)
                    phys = torch.tensor(self.lane_blocks[ch.lane][full_lo:full_hi])
                    self.host.k[l][phys] = kb.transpose(0, 1).to("cpu")
                    self.host.v[l][phys] = vb.transpose(0, 1).to("cpu")
            if ch.last:
                q_last.append(q[-1])
            x = self.dec.finish(l, x, attn)
            if l in layers_aux:
                aux[l] = x[-1]
        if not ch.last:
            return {}
        if sparse:
            self._first_working_set(ch, q_last, end)
            del self.scratch[ch.req_id]
        logits = self.dec.logits(x[-1:])
        self.last_logits = {ch.req_id: logits[0]}
        tok = self.sampler(logits, [sampling[ch.req_id]])
        if self.draft is not None:
            self.draft_tok[ch.lane] = self.draft.propose(torch.cat([aux[i] for i in layers_aux])[None], tok)[0]
        return {ch.req_id: int(tok[0])}

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

    def _first_working_set(self, ch, q_last, n_tok) -> None:
        """Local block from the prompt's tail; the first step's top-K from the last prompt token's query."""
        st, bs, H, dev = self.store, self.bs, self.H, self.device
        sk, sv = self.scratch[ch.req_id]
        lane = torch.tensor([ch.lane], device=dev)
        base = st.slot_base(lane)[0]  # [H]
        tail0 = (n_tok // bs) * bs
        nb = n_tok // bs + 1  # blocks incl. the (possibly empty) local one
        rows = slice(ch.lane * H, (ch.lane + 1) * H)
        for l in range(self.L):
            m = n_tok - tail0
            if m:
                st.k[l][base + st.LOCAL, :m] = sk[l, :, tail0:n_tok]
                st.v[l][base + st.LOCAL, :m] = sv[l, :, tail0:n_tok]
            scores = ops.block_score(q_last[l][None], st.kmin[l], st.kmax[l],
                                     torch.tensor([nb], dtype=torch.int32, device=dev),
                                     lane.to(torch.int32))
            pred = topk_blocks(scores.view(H, -1), self.K, torch.full((H,), nb, device=dev))  # [H, K]
            plan = initial_plan(pred, step=0, slots=self.K)
            st.resident[l, rows] = plan.resident
            st.last_sel[l, rows] = plan.last_sel
            blk = plan.resident.clamp(min=0)  # [H, K]
            tok = blk[:, :, None] * bs + torch.arange(bs, device=dev)  # [H, K, bs]
            kk = torch.gather(sk[l], 1, tok.reshape(H, -1, 1).expand(-1, -1, sk.shape[-1]))
            vv = torch.gather(sv[l], 1, tok.reshape(H, -1, 1).expand(-1, -1, sv.shape[-1]))
            dst = (base[:, None] + torch.arange(self.K, device=dev)).reshape(-1)
            st.k[l][dst] = kk.reshape(H * self.K, bs, -1)
            st.v[l][dst] = vv.reshape(H * self.K, bs, -1)

    # -- decode ----------------------------------------------------------------------------------------------------

    def _decode(self, plan: RunnerCall) -> dict:
        cfg, dev = self.cfg, self.device
        items = plan.decode
        lanes_list = [it.lane for it in items]
        pos_list = [it.position for it in items]
        toks = torch.tensor([it.token for it in items], device=dev)
        pos = torch.tensor(pos_list, device=dev)
        sets, synth_ready = self.sources.sets(lanes_list, pos_list)
        recorded = [] if self.sources.record is not None else None
        if self._graph_ok(lanes_list):
            logits, aux = self._replay(lanes_list, toks, pos, sets)
        else:
            lanes = torch.tensor(lanes_list, device=dev)
            logits, aux = self._decode_core(lanes, _rows_of(lanes_list, self.H), toks, pos, sets, recorded)
        if synth_ready is not None:
            self.sources.presynth(lanes_list, synth_ready)
        self.last_logits = {it.req_id: logits[i] for i, it in enumerate(items)}
        tok = self.sampler(logits, [plan.sampling[it.req_id] for it in items])
        if self.draft is not None:
            self.draft_tok[torch.tensor(lanes_list, device=dev)] = self.draft.propose(aux, tok)
        out = tok.tolist()  # the step's one host synchronisation
        if self.pipe is not None and cfg.profile and dev.type == "cuda":
            for k_, v_ in self.pipe.collect(self._step_ref).items():
                self.stage_ms[k_] = self.stage_ms.get(k_, 0.0) + v_
            if self._step_ref is not None:  # side-stream stages of a traced step (--profile; ran on the H200)
                self.layer_events += [[self.trace_step, l, k_, a, b] for k_, l, a, b in self.pipe.events if a >= 0]
                self.pipe.events = []
        self._step_ref = None
        if recorded:
            self.sources.add_record(recorded, [it.req_id for it in items], pos_list)
        self.decode_steps += 1
        return {it.req_id: out[i] for i, it in enumerate(items)}

    # -- CUDA graphs ----------------------------------------------------------------------------------------------

    def _graph_ok(self, lanes_list) -> bool:
        """Whole-step CUDA graphs: no profiling events, no recording or replayed selection, lanes 0..B-1; the host
        transfer path only where its graph mode is available (``Prefetcher.graph_host``)."""
        cfg = self.cfg
        if not cfg.cuda_graph or self.device.type != "cuda" or cfg.profile or self.sources.record is not None \
                or (self.pipe is not None and not self.pipe.cuda):
            return False
        if cfg.sparse and self.pipe.path != "uva" and not cfg.no_transfer and not self.pipe.graph_host:
            return False
        return lanes_list == list(range(len(lanes_list)))

    def _replay(self, lanes_list, toks, pos, sets):
        B = len(lanes_list)
        g = self.graphs.get(B)
        if g is None and B not in self._warm:  # one eager step first: kernels compile, workspaces allocate
            self._warm.add(B)
            lanes = torch.arange(B, device=self.device)
            return self._decode_core(lanes, slice(0, B * self.H), toks, pos, sets, None)
        if g is None:
            if self.pipe is not None:
                self.pipe.wait_all()
            st = {"toks": toks.clone(), "pos": pos.clone(), "sets": None if sets is None else sets.clone(),
                  "lanes": torch.arange(B, device=self.device)}
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            if self.pipe is not None:
                self.pipe.begin_capture(B)
            self._capturing = True
            try:
                with no_gc(), torch.cuda.graph(graph):
                    logits, aux = self._decode_core(st["lanes"], slice(0, B * self.H), st["toks"], st["pos"],
                                                    st["sets"], None)
                    if self.pipe is not None:
                        self.pipe.wait_all()  # every side stream joins before the capture ends
            finally:
                self._capturing = False
            if self.pipe is not None:
                st["keep"], self.pipe.keep = self.pipe.keep, []
                self.pipe.capture_copies(B)  # UVA copy graphs: this step's copies, a graph of their own
            g = self.graphs[B] = (graph, st, logits, aux)
        graph, st, logits, aux = g
        st["toks"].copy_(toks)
        st["pos"].copy_(pos)
        if sets is not None:
            st["sets"].copy_(sets)
        if self.pipe is not None:
            self.pipe.before_replay()  # the host path's graph mode: last step's copies are enqueued
        graph.replay()
        if self.pipe is not None:
            self.pipe.after_replay(B)  # UVA copy graphs: its copies; host path's graph mode: the worker's jobs
        return logits, aux

    # -- the decode step (device work only: eager, or captured into a graph) --------------------------------------

    def _decode_core(self, lanes, rows, toks, pos, sets, recorded):
        """One decode step for lanes [B]; rows: the lanes' rows (slice or index). Reads only device tensors, so the
        same code runs eagerly and under CUDA-graph capture. Returns (logits [B, V], aux [B, 3 * hidden])."""
        cfg, dev, st, bs, H = self.cfg, self.device, self.store, self.bs, self.H
        B = lanes.shape[0]
        mode = self.mode
        nq = 2 if mode.drafts else 1
        if nq == 2:
            ids = torch.stack([toks, self.draft_tok[lanes]], 1).reshape(-1)
            positions = torch.stack([pos, pos + 1], 1).reshape(-1)
        else:
            ids, positions = toks, pos
        if cfg.sparse:
            self.caps.step_start()  # the step clock an adaptive fetch policy reads (nothing for a static one)
        x = self.dec.embed[ids]
        lanes32 = lanes.to(torch.int32)
        nb_cur = pos // bs + 1  # blocks of the context incl. the local block (which holds ``pos``)
        nb_next = (pos + 1) // bs + 1
        local_len = (pos % bs + 1).to(torch.int32)
        hh = torch.arange(H, device=dev)
        item_row = (lanes[:, None] * H + hh).reshape(-1).to(torch.int32)  # summary / write-back items [B * H]
        item_blk = (pos // bs).repeat_interleave(H).to(torch.int32)
        item_len = local_len.repeat_interleave(H)
        aux = {}
        layers_aux = self.draft.layers if self.draft is not None else ()
        if cfg.sparse:
            base = st.slot_base(lanes)  # [B, H]
            local_slot = base + st.LOCAL
            item_src = local_slot.reshape(-1).to(torch.int32)
            phys = st.host_table[lanes, pos // bs]  # host block of each lane's local block
            item_dst = (phys[:, None] * H + hh).reshape(-1).to(torch.int32)
            sel_off = torch.arange(st.S, device=dev)
        else:
            page_cur = lanes * st.P + pos // bs
            item_src = (page_cur[:, None] * H + hh).reshape(-1).to(torch.int32)
        off32 = (pos % bs).to(torch.int32)  # the new token's offset in its block
        fused_kv = cfg.fused_ops and cfg.fused_kv_write
        prof = cfg.profile and dev.type == "cuda"
        trace = cfg.profile and self.trace_step is not None and not self._capturing
        cpu_marks = [] if trace and not prof else None  # CPU: perf_counter as each layer begins, then the end
        if cpu_marks is not None and self.pipe is not None:
            self.pipe.trace = []
        if prof:
            ev_layers = []
        for l in range(self.L):
            if prof:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                ev_layers.append(e)
            if cpu_marks is not None:
                cpu_marks.append(time.perf_counter())
            q, k, v = self.dec.qkv(l, x, positions)
            Hq = q.shape[1]
            q = q.view(B, nq, Hq, -1)
            k = k.view(B, nq, H, -1)
            v = v.view(B, nq, H, -1)
            if cfg.sparse:
                self.pipe.wait(l)
                ops.kv_write(k[:, 0], v[:, 0], st.k[l], st.v[l], item_src, off32, fused_kv)
                if mode.on_demand:
                    pred = self._predict(l, q[:, 0], lanes32, nb_cur, sets[0][:, l] if sets is not None else None,
                                         recorded)
                    self.pipe.fetch_now(l, pred, lanes, rows)
                res = st.resident[l][rows].view(B, H, st.S)
                slot_ids = torch.where(res >= 0, base[:, :, None] + sel_off, -1).to(torch.int32)
                ek = ev = None
                if nq == 2:
                    ek = k[:, 1:].transpose(1, 2).contiguous()
                    ev = v[:, 1:].transpose(1, 2).contiguous()
                attn = ops.sparse_attn(q.transpose(1, 2), st.k[l], st.v[l], slot_ids, local_slot.to(torch.int32),
                                       local_len, ek, ev)  # [B, Hq, nq, D]
                attn = attn.transpose(1, 2).reshape(B * nq, Hq, -1)
                # The local block's summary (exact for its valid tokens) and, once full, its host copy.
                ops.summary_update(st.k[l], item_src, item_row, item_blk, item_len,
                                   st.kmin[l].view(-1, st.NB, st.D), st.kmax[l].view(-1, st.NB, st.D))
                writeback_full(st.k[l], st.v[l], self.host.k[l], self.host.v[l], item_src, item_dst, item_len, bs)
                if mode.background:
                    after = None
                    if dev.type == "cuda" and self.pipe.cuda:
                        after = torch.cuda.Event()
                        after.record()
                        extra = (sets,) if sets is not None else ()
                        self.pipe._cross_stream(self.pipe.s_pred, q, lanes, lanes32, nb_next, *extra)
                    qsel = q[:, nq - 1]
                    src = None
                    if sets is not None:
                        src = (sets[1] if mode.drafts else sets[2])[:, l]
                    predict = (lambda l=l, qsel=qsel, src=src:
                               self._predict(l, qsel, lanes32, nb_next, src, recorded))
                    self.pipe.launch(l, after, predict, lanes, rows)
            else:
                ops.kv_write(k[:, 0], v[:, 0], st.k[l].view(-1, bs, st.D), st.v[l].view(-1, bs, st.D), item_src,
                             off32, fused_kv)
                if not mode.selects:
                    attn = ops.paged_attn(q[:, 0].contiguous(), st.k[l], st.v[l], st.block_table[lanes],
                                          (pos + 1).to(torch.int32))
                    attn = attn.reshape(B, Hq, -1)
                else:  # quest
                    ids_ = self._predict(l, q[:, 0], lanes32, nb_cur, sets[0][:, l] if sets is not None else None,
                                         recorded).view(B, H, -1)
                    pg = lanes[:, None, None] * st.P + ids_.clamp(min=0)
                    slot_ids = torch.where(ids_ >= 0, pg * H + hh[None, :, None], -1).to(torch.int32)
                    lslot = (page_cur[:, None] * H + hh).to(torch.int32)
                    kf = st.k[l].view(-1, bs, st.D)
                    vf = st.v[l].view(-1, bs, st.D)
                    attn = ops.sparse_attn(q[:, 0][:, :, None], kf, vf, slot_ids, lslot, local_len)[:, :, 0]
                    ops.summary_update(kf, item_src, item_row, item_blk, item_len,
                                       st.kmin[l].view(-1, st.P, st.D), st.kmax[l].view(-1, st.P, st.D))
            x = self.dec.finish(l, x, attn)
            if l in layers_aux:
                aux[l] = x.view(B, nq, -1)[:, 0]
        if cfg.sparse:
            self.caps.step_end()
        if prof:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            ev_layers.append(e)
            torch.cuda.current_stream().synchronize()
            t = sum(ev_layers[i].elapsed_time(ev_layers[i + 1]) for i in range(self.L))
            self.stage_ms["layers"] = self.stage_ms.get("layers", 0.0) + t
            if trace:  # --profile's layer events (ran on the H200); side-stream stages: _decode, collect
                ref = self._step_ref = ev_layers[0]
                self.layer_events += [[self.trace_step, i, "layers", ref.elapsed_time(ev_layers[i]),
                                       ref.elapsed_time(ev_layers[i + 1])] for i in range(self.L)]
        if cpu_marks is not None:
            cpu_marks.append(time.perf_counter())
            t0 = cpu_marks[0]
            ev = [("layers", i, cpu_marks[i], cpu_marks[i + 1]) for i in range(self.L)]
            if self.pipe is not None:
                ev += self.pipe.trace
                self.pipe.trace = None
            self.layer_events += [[self.trace_step, l, k_, 1e3 * (a - t0), 1e3 * (b - t0)] for k_, l, a, b in ev]
        logits = self.dec.logits(x.view(B, nq, -1)[:, 0])
        aux_t = torch.cat([aux[i] for i in layers_aux], -1) if layers_aux else None
        return logits, aux_t

    def _predict(self, l, qsel, lanes32, n_blocks, src, recorded=None):
        """The top-K blocks per row [B * H, K] of layer ``l``: scored from ``qsel`` [B, Hq, D] against the summaries
        (always run, so synthetic runs pay for it), then taken from the selection source."""
        st = self.store
        scores = ops.block_score(qsel.contiguous(), st.kmin[l], st.kmax[l], n_blocks.to(torch.int32), lanes32)
        B = qsel.shape[0]
        if src is not None:
            pred = src.reshape(B * self.H, -1)
        else:
            pred = topk_blocks(scores.view(B * self.H, -1), self.K, n_blocks.repeat_interleave(self.H))
        if recorded is not None:
            recorded.append(pred)
        return pred

    def _sample_default(self, logits, sampling):
        temps = [sp.temperature for sp in sampling]
        greedy = logits.argmax(-1)
        if all(t == 0 for t in temps):
            return greedy
        t = torch.tensor([max(x, 1e-6) for x in temps], device=logits.device)[:, None]
        probs = torch.softmax(logits / t, -1)
        drawn = torch.multinomial(probs, 1, generator=self.gen)[:, 0]
        hot = torch.tensor([x > 0 for x in temps], device=logits.device)
        return torch.where(hot, drawn, greedy)

    # -- accounting -----------------------------------------------------------------------------------------------

    def extend_blocks(self, lane: int, blocks) -> None:
        """Host blocks a lane's request took as it grew: appended to its block table (sparse modes). Scalar writes
        (a fill kernel each, usually one block) so that no host-to-device copy synchronises the step."""
        have = self.lane_blocks[lane]
        for b in blocks:
            self.store.host_table[lane, len(have)] = int(b)
            have.append(b)

    def release(self, req_id) -> None:
        """Drop what the runner holds for a request that ended early (the prompt KV scratch of a chunked prefill)."""
        self.scratch.pop(req_id, None)

    def counters(self) -> dict:
        if self.pipe is None:
            return {"units_fetched": 0, "missing": 0}
        return {"units_fetched": int(self.pipe.units), "missing": int(self.pipe.missing)}

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.wait_all()
        self.sources.save()
        if self.pipe is not None:
            self.pipe.close()
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
