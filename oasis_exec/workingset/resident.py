"""The resident family (retrieval, proxy, lookahead; the victim cache): the KV in host memory, a bounded set of
slots a row on the GPU.

Layer ``l`` of a decode step: wait for its background copies of the previous step -> write the real token's K/V
into the local block -> (retrieval: select and copy now, on the critical path) -> sparse attention over the row's
slots and the local block (+ the draft token's own K/V for the draft query) -> summarise the local block and, once
full, write it back to the host -> launch the next step's prediction -> selection -> transfer in the background
(proxy: from the real query; lookahead: from the draft query; ``Prefetcher.launch``).

Short contexts (``oasis_core.short_context``; ``prepare``'s ``short``): "all" is the resident-dense step (no
draft row, no selection, fetch or write-back, the first ``dense_slots`` slots of each row attended); "some" carries
the short lanes' slot tables into every layer (a short lane's block j lives in its slot j) and plans their rows
with cap 0. At a crossing step (``cross``) each layer first copies the crossing lanes' GPU blocks to their host
blocks (``_offload``) and fetches their first top-K from the real query.

An fp8 host copy is rounded where blocks become resident without a fetch (the first working set, a crossing
lane's blocks), so every resident non-local slot holds what its host copy reads back as.
"""

from __future__ import annotations

import torch

from .. import ops
from ..kv.layer_table import table
from ..transfer.writeback import writeback_full
from .base import WorkingSet, causal_attn
from .step import ResidentRows


class ResidentSet(WorkingSet):
    family = "resident"

    def __init__(self, parts):
        super().__init__(parts)  # lane_blocks: the block tables' host copy; scratch: (k [L, H, T, D], v) a prefill
        self._q_last = {}  # req_id -> {layer: the last prompt token's query} of the last chunk

    # -- decode -------------------------------------------------------------------------------------------------

    def prepare(self, s, short="none", dense_slots=None, cross=None):
        """The step's per-row tensors (``ResidentRows``): slot bases, local slots, the short lanes' slot tables,
        the write-back's destinations, the crossing lanes' offload items."""
        p = self.p
        dev, st, bs, H, hh, lanes, pos = p.device, p.store, p.bs, p.H, s.hh, s.lanes, s.pos
        if not s.all_short:
            p.caps.step_start()  # the step clock an adaptive fetch policy reads (nothing for a static one)
        base = st.slot_base(lanes)  # [B, H]
        r = ResidentRows(
            base=base, local_slot=base + st.LOCAL, sel_off=torch.arange(st.S, device=dev), wb_len=s.item_len
        )
        if p.short is not None and short != "none":
            self._short_rows(s, r, dense_slots)
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

    def _short_rows(self, s, r, dense_slots) -> None:
        """A short lane's block j lives in its slot j (its newest, partial block too; block K is the local slot),
        so nothing moves as it grows: its full blocks are slots 0 .. pos // bs - 1."""
        p = self.p
        st, bs, H, pos, base = p.store, p.bs, p.H, s.pos, r.base
        short_lane = pos + 1 <= p.short.window_tokens  # [B] resident-dense this step
        short_row = short_lane.repeat_interleave(H)
        r.local_slot = torch.where(short_lane[:, None], base + (pos // bs)[:, None], r.local_slot)
        r.in_order = torch.where(r.sel_off < (pos // bs)[:, None], r.sel_off, -1)  # [B, S] block of each slot
        r.wb_len = torch.where(short_row, torch.zeros_like(s.item_len), s.item_len)  # nothing to the host yet
        p.pipe.zero_rows = None if s.all_short else short_row  # planned with cap 0 (nothing fetched)
        if s.all_short:  # the same slots in every layer; only the first dense_slots can hold a full block
            n = st.S if dense_slots is None else dense_slots
            ids = torch.where(r.in_order[:, None, :n] >= 0, base[:, :, None] + r.sel_off[:n], -1)
            r.slot_ids_all = ids.to(torch.int32)
        else:
            r.sr = short_row[:, None]
            r.res_short = r.in_order.repeat_interleave(H, 0)  # [B * H, S]
            r.ls_short = torch.where(r.res_short >= 0, 0, -1)

    def layer(self, l, s, r, q, k, v):
        """Layer ``l`` (q [B, nq, Hq, D], k/v [B, nq, H, D]): wait for this layer's background copies, write the
        token's K/V, fetch on demand (on-demand modes, the crossing lanes), attend the row's slots and the local
        block, summarise and write back the local block, then launch the next step's prediction (background
        modes) or, in a verification pass, keep what ``commit`` needs. Returns attn [B * nq, Hq, D]."""
        p = self.p
        st, cfg = p.store, p.cfg
        p.pipe.wait(l)
        if r.in_order is not None and not s.all_short:  # short rows' tables: their blocks in slot order
            st.resident[l][s.rows] = torch.where(r.sr, r.res_short, st.resident[l][s.rows])
            st.last_sel[l][s.rows] = torch.where(r.sr, r.ls_short, st.last_sel[l][s.rows])
        if r.ci is not None:  # crossing lanes: their KV so far to the host, before the local slot is reused
            self._offload(l, r.c_rows, *r.c_items)
        ops.kv_write(k[:, 0], v[:, 0], st.k[l], st.v[l], s.item_src, s.off32, cfg.fused_ops and cfg.fused_kv_write)
        if r.ci is not None and not cfg.mode_spec.on_demand:  # the crossing lanes' first top-K, fetched now
            pred = p.selector.predict(l, q[r.ci, 0], s.lanes32[r.ci], s.nb_cur[r.ci], None)
            p.pipe.fetch_now(l, pred, r.c_lanes, r.c_rows)
        attn, ek, ev = self._attend(l, q, k, v, self._step_slots(l, s, r, q), r.local_slot, s.local_len)
        self._summarize(l, s.item_src, s.item_row, s.item_blk, s.item_len)  # exact for its valid tokens
        if not s.all_short:
            sc = self._scales(l)
            writeback_full(st.k[l], st.v[l], p.host.k[l], p.host.v[l], s.item_src, r.item_dst, r.wb_len, p.bs, sc)
        if s.saved is not None:  # a verification pass: the next step's prediction waits for the acceptance
            if self.spec_pipe is not None:  # spec_predict beside: the candidates and the chosen plan, beside the pass
                self.spec_pipe.beside(l, q, s.lanes, s.rows, s.pos, s.sets)
            s.saved[l] = (q, ek, ev)
        elif cfg.mode_spec.background and not s.all_short:
            given = None if s.sets is None else (s.sets[1] if cfg.mode_spec.drafts else s.sets[2])[:, l]
            self._launch_prediction(l, self._prediction_query(q, s), given, s, s.nb_next)
        return attn

    def _prediction_query(self, q, s):
        """The query the next step's blocks are predicted from [B, Hq, D]: the draft row's (lookahead; the current
        one in proxy), or, under ``ExecConfig.draft_gate``, the current one where the lane's draft is unsure."""
        qsel = q[:, s.nq - 1]
        if self.draft_conf is not None and s.nq > 1:
            sure = self.draft_conf[s.lanes] >= self.p.cfg.draft_gate  # [B], on the device (capturable)
            qsel = torch.where(sure[:, None, None], qsel, q[:, 0])
        return qsel

    def _own_prediction(self, l, s, q):
        """The step's own top-K of layer ``l`` (on-demand modes): from the real query, or the given sets."""
        given = s.sets[0][:, l] if s.sets is not None else None
        return self.p.selector.predict(l, q[:, 0], s.lanes32, s.nb_cur, given, s.recorded)

    def _step_slots(self, l, s, r, q):
        """The slots layer ``l`` attends, int32 [B, H, K'] (retrieval fetches its top-K first)."""
        if r.slot_ids_all is not None:
            return r.slot_ids_all
        if self.p.cfg.mode_spec.on_demand and not s.all_short:
            self.p.pipe.fetch_now(l, self._own_prediction(l, s, q), s.lanes, s.rows)
        return self.slot_ids(l, s.rows, r.base, r.sel_off)

    def end_step(self, s) -> None:
        if not s.all_short:
            self.p.caps.step_end()
        self.p.pipe.zero_rows = None

    def slot_ids(self, l, rows, base, sel_off):
        """The slots layer ``l``'s attention reads in a background mode, int32 [B, H, K']: every resident slot
        (``S == K``, the paper's working set), or with a victim cache (``S > K``: ``ExecConfig.hot_slots``) the ``K``
        most recently selected resident slots of each row (``ops.attend_slots``, one launch)."""
        p = self.p
        st = p.store
        B, H = base.shape
        if st.S > p.K:
            return ops.attend_slots(st.resident[l], st.last_sel[l], p.pipe.row_ids(rows), p.K, st.W).view(B, H, p.K)
        res = st.resident[l][rows].view(B, H, st.S)
        return torch.where(res >= 0, base[:, :, None] + sel_off, -1).to(torch.int32)

    def _attend(self, l, q, k, v, slot_ids, local_slot, local_len):
        """Sparse attention of layer ``l``: queries ``q`` [B, nq, Hq, D] over each row's slots ``slot_ids`` and its
        local block, positions 1.. also over the earlier positions' own KV (``k``/``v`` [B, nq, H, D]: draft or
        verified positions, not in the cache). Returns (attn [B * nq, Hq, D], their KV [B, H, nq - 1, D] or None x2)."""
        st = self.p.store
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
        st = self.p.store
        if st.tok is not None:  # block_score=tokens: every token's kept channels
            return st.tok.update(l, st.k[l], item_src, item_row, item_blk, item_len)
        kmin, kmax = st.kmin[l].view(-1, st.NB, st.D), st.kmax[l].view(-1, st.NB, st.D)
        ops.summary_update(st.k[l], item_src, item_row, item_blk, item_len, kmin, kmax, self.p.cfg.block_score)

    def _launch_prediction(self, l, qsel, given, s, nb_next) -> None:
        """Layer ``l``'s background prediction -> selection -> transfer for the next step (``Prefetcher.launch``),
        started once the main stream reaches this point: query ``qsel`` [B, Hq, D], the step's drawn or replayed
        sets for it ``given`` (or None), the next step's block counts ``nb_next``. On CUDA the tensors the side
        stream reads are handed across (``Prefetcher.cross_stream``)."""
        p = self.p
        pipe, lanes, lanes32 = p.pipe, s.lanes, s.lanes32
        after = None
        if pipe.cuda:
            after = torch.cuda.Event()
            after.record()
            extra = tuple(t for t in (s.sets, pipe.zero_rows) if t is not None)
            pipe.cross_stream(pipe.s_pred, qsel, lanes, lanes32, nb_next, *extra)

        def predict():
            return p.selector.predict(l, qsel, lanes32, nb_next, given, s.recorded)

        pipe.launch(l, after, predict, lanes, s.rows)

    def _scales(self, l):
        """``(k_scale, v_scale)`` of layer ``l`` of an fp8 host pool (``writeback_full``'s ``scales``), else None."""
        h = self.p.host
        return (h.k_scale[l], h.v_scale[l]) if h.quantized else None

    # -- crossing (short lanes outgrowing their window) --------------------------------------------------------------

    def _offload_items(self, lanes):
        """The crossing lanes' copy items, the same in every layer: the slots of their rows' blocks 0 .. K (block j
        in slot j, block K in slot K: the local slot when ``S == K``, a hot-cache slot when ``S > K``; the short
        lanes' placement) and those blocks' host units. Returns (src, dst) int32 [C * H * (K + 1)]."""
        p = self.p
        st, H, dev, K = p.store, p.H, p.device, p.K
        C = lanes.shape[0]
        j = torch.arange(K + 1, device=dev)  # slot j holds block j (slot K == S is the local slot when S == K)
        rows = (lanes[:, None] * H + torch.arange(H, device=dev)).reshape(-1)  # [C * H]
        src = rows[:, None] * st.W + j  # [C * H, K + 1]
        blk = st.host_table[lanes][:, : K + 1].repeat_interleave(H, 0)  # [C * H, K + 1] host blocks
        dst = blk * H + torch.arange(H, device=dev).repeat(C)[:, None]
        return src.reshape(-1).to(torch.int32), dst.reshape(-1).to(torch.int32)

    def _offload(self, l, c_rows, src, dst) -> None:
        """Layer ``l`` of a crossing: the crossing rows' ``K + 1`` GPU blocks copied to their host units by the
        write-back kernel, on the current stream (no host synchronisation), and their tables set to blocks
        0 .. n-1 in slots 0 .. n-1, ``n = min(S, K + 1)``."""
        p = self.p
        st, bs = p.store, p.bs
        full = torch.full_like(src, bs)
        sc = self._scales(l)  # fp8: the slots keep what the host copy reads back as (roundtrip)
        writeback_full(st.k[l], st.v[l], p.host.k[l], p.host.v[l], src, dst, full, bs, sc, roundtrip=sc is not None)
        j = torch.arange(st.S, device=p.device)
        held = j < min(st.S, p.K + 1)
        st.resident[l][c_rows] = torch.where(held, j, -1)
        st.last_sel[l][c_rows] = torch.where(held, 0, -1)

    # -- speculative decoding -------------------------------------------------------------------------------------

    def prepare_verify(self, s):
        s.saved = {}
        return self.prepare(s)

    def verify_layer(self, l, s, r, q, k, v):
        return self.layer(l, s, r, q, k, v)

    def commit(self, s, n, sets, recorded) -> None:
        """After a verification pass's acceptance (``n`` [B] int64 accepted drafts a lane, on the device; no host
        synchronisation): the accepted drafts' KV into the local block, the summary and host copy of a block they
        fill, the new local block's summary, then each layer's background prediction for the next step. Nothing
        of a rejected draft is written: every write is masked to the accepted run."""
        from .commit import commit_accepted

        commit_accepted(self, s, n, sets, recorded)
        self.end_step(s)

    # -- CUDA graphs ---------------------------------------------------------------------------------------------

    def begin_capture(self, key) -> None:
        self.p.pipe.begin_capture(key)

    def end_capture(self, key) -> list:
        self.p.pipe.wait_all()  # every side stream joins before the capture ends
        keep, self.p.pipe.ext.keep = self.p.pipe.ext.keep, []
        return keep

    def after_capture(self, key) -> None:
        self.p.pipe.capture_copies(key)  # UVA copy graphs: this step's copies, a graph of their own

    def before_replay(self) -> None:
        self.p.pipe.before_replay()

    def after_replay(self, key) -> None:
        self.p.pipe.after_replay(key)

    def wait_all(self) -> None:
        self.p.pipe.wait_all()

    # -- prefill and admission ---------------------------------------------------------------------------------------

    def prefill_layer(self, l, ch, q, k, v, pos):
        p = self.p
        bs, H, D = p.bs, p.H, p.store.D
        start, end = ch.start, ch.start + len(ch.tokens)
        if ch.req_id not in self.scratch:  # the set's layers only (a sliding layer's prompt KV goes to its ring)
            shape = (H, p.cfg.max_blocks * bs, D)
            held = p.store.layers
            self.scratch[ch.req_id] = tuple(table(p.L, held, shape, 0, p.dtype, p.device, "scratch") for _ in "kv")
        sk, sv = self.scratch[ch.req_id]
        sk[l, :, start:end] = k.transpose(0, 1)
        sv[l, :, start:end] = v.transpose(0, 1)
        keys, vals = sk[l, :, :end], sv[l, :, :end]
        lo, hi = start // bs, end // bs  # blocks completed by this chunk
        if hi > lo:
            kb = keys[:, lo * bs : hi * bs].reshape(H, hi - lo, bs, D)
            ops.write_block_summaries(p.store, l, ch.lane, lo, kb, p.cfg.block_score)
            if not self._short_lane(ch):
                vb = vals[:, lo * bs : hi * bs].reshape(H, hi - lo, bs, D)
                phys = torch.tensor(self.lane_blocks[ch.lane][lo:hi])
                p.host.write(l, phys, kb.transpose(0, 1), vb.transpose(0, 1))  # fp8: quantized here
        if ch.last:
            self._q_last.setdefault(ch.req_id, {})[l] = q[-1]
        return causal_attn(q, keys, vals, start)

    def _short_lane(self, ch) -> bool:
        """A lane with no host blocks is short (its whole context fits its slots)."""
        return self.p.short is not None and not self.lane_blocks[ch.lane]

    def prefill_done(self, ch) -> None:
        """After the last chunk: the first working set, then the prompt KV scratch is dropped."""
        from .first_fill import first_working_set

        first_working_set(self, ch, self._q_last.pop(ch.req_id, {}), ch.start + len(ch.tokens), self._short_lane(ch))
        del self.scratch[ch.req_id]

    def admit(self, lane, host_blocks) -> None:
        """A new request on ``lane`` with ``host_blocks``: its block table and slots reset, its policy rows too."""
        p = self.p
        self.lane_blocks[lane] = list(host_blocks)
        p.store.reset_lane(lane, host_blocks)
        p.caps.reset_rows(slice(lane * p.H, (lane + 1) * p.H))  # adaptive policies' row state

    def extend(self, lane, blocks) -> bool:
        """Appended to the lane's block table: scalar writes (a fill kernel each, usually one block), so that no
        host-to-device copy synchronises the step."""
        have = self.lane_blocks[lane]
        first = not have
        for b in blocks:
            self.p.store.host_table[lane, len(have)] = int(b)
            have.append(b)
        return first

    def synthesize(self, a, g, layers) -> None:
        """The prompt's slots of each of ``layers`` filled with random K/V; the first K eligible blocks resident
        (replaced by the synthetic set when one is used)."""
        p = self.p
        st, dev = p.store, p.device
        n_full = (a.prompt_len - 1) // p.bs
        lane = torch.tensor([a.lane], device=dev)
        slots = (st.slot_base(lane)[0][:, None] + torch.arange(st.W, device=dev)).reshape(-1)
        k = min(p.K, max(n_full, 0))
        rows = slice(a.lane * p.H, (a.lane + 1) * p.H)
        for l in layers:
            st.k[l][slots] = torch.randn(slots.numel(), p.bs, st.D, generator=g, device=dev).to(p.dtype)
            st.v[l][slots] = torch.randn(slots.numel(), p.bs, st.D, generator=g, device=dev).to(p.dtype)
            st.resident[l, rows, :k] = torch.arange(k, device=dev)
            st.last_sel[l, rows, :k] = 0

    def release(self, req_id) -> None:
        self.scratch.pop(req_id, None)
        self._q_last.pop(req_id, None)
