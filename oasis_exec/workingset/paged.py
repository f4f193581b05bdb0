"""The paged family (dense, quest): the whole KV on the GPU in pages, one page table a lane.

``dense`` attends every token (``oasis_kernels.paged_attn``); ``quest`` attends the top-K pages by the summaries
plus the local page (``oasis_kernels.sparse_attn`` over the pages seen as slots) and keeps the local page's summary.
Nothing moves between host and GPU.
"""

from __future__ import annotations

import torch

from .. import ops
from .base import WorkingSet, causal_attn
from .step import PagedRows


class PagedSet(WorkingSet):
    family = "paged"

    def prepare(self, s, short="none", dense_slots=None, cross=None):
        """The new token's page, its items' source pages and block offset (``DecodeStep`` fields)."""
        st, bs, H = self.p.store, self.p.bs, self.p.H
        s.page_cur = s.lanes * st.P + s.pos // bs
        s.item_src = (s.page_cur[:, None] * H + s.hh).reshape(-1).to(torch.int32)
        s.off32 = (s.pos % bs).to(torch.int32)
        return None

    def layer(self, l, s, r, q, k, v):
        """Layer ``l`` (q [B, 1, Hq, D], k/v [B, 1, H, D]): the token's K/V into its page, then paged attention
        (dense) or the top-K pages and the local page (quest, whose local summary is then updated). Returns attn
        [B, Hq, D]."""
        p = self.p
        st, bs, B, cfg = p.store, p.bs, s.B, p.cfg
        kf, vf = st.k[l].view(-1, bs, st.D), st.v[l].view(-1, bs, st.D)
        ops.kv_write(k[:, 0], v[:, 0], kf, vf, s.item_src, s.off32, cfg.fused_ops and cfg.fused_kv_write)
        if not cfg.mode_spec.selects:
            attn = ops.paged_attn(
                q[:, 0].contiguous(), st.k[l], st.v[l], st.block_table[s.lanes], (s.pos + 1).to(torch.int32)
            )
            return attn.reshape(B, q.shape[2], -1)
        given = s.sets[0][:, l] if s.sets is not None else None  # quest
        ids_ = p.selector.predict(l, q[:, 0], s.lanes32, s.nb_cur, given, s.recorded).view(B, p.H, -1)
        pg = s.lanes[:, None, None] * st.P + ids_.clamp(min=0)
        slot_ids = torch.where(ids_ >= 0, pg * p.H + s.hh[None, :, None], -1).to(torch.int32)
        lslot = (s.page_cur[:, None] * p.H + s.hh).to(torch.int32)
        attn = ops.sparse_attn(q[:, 0][:, :, None], kf, vf, slot_ids, lslot, s.local_len)[:, :, 0]
        if st.tok is not None:  # block_score=tokens: every token's kept channels
            st.tok.update(l, kf, s.item_src, s.item_row, s.item_blk, s.item_len)
        else:
            kmin, kmax = st.kmin[l].view(-1, st.P, st.D), st.kmax[l].view(-1, st.P, st.D)
            ops.summary_update(kf, s.item_src, s.item_row, s.item_blk, s.item_len, kmin, kmax, cfg.block_score)
        return attn

    def prepare_verify(self, s):
        """A verification pass writes every position's K/V into the pages and attends each position as a query
        row of its own (``PagedRows``)."""
        st, bs, H = self.p.store, self.p.bs, self.p.H
        page = s.lanes[:, None] * st.P + s.positions.view(s.B, s.nq) // bs  # [B, nq]
        return PagedRows(
            rows_all=(page.reshape(-1)[:, None] * H + s.hh).reshape(-1).to(torch.int32),
            offs_all=(s.positions % bs).to(torch.int32),
            tables=st.block_table[s.lanes].repeat_interleave(s.nq, 0),
            lens=(s.positions + 1).to(torch.int32),
        )

    def verify_layer(self, l, s, r, q, k, v):
        p = self.p
        st, bs, cfg = p.store, p.bs, p.cfg
        n = s.B * s.nq
        q, k, v = q.reshape(n, q.shape[2], -1), k.reshape(n, p.H, -1), v.reshape(n, p.H, -1)
        kf, vf = st.k[l].view(-1, bs, st.D), st.v[l].view(-1, bs, st.D)
        ops.kv_write(k, v, kf, vf, r.rows_all, r.offs_all, cfg.fused_ops and cfg.fused_kv_write)
        return ops.paged_attn(q.contiguous(), st.k[l], st.v[l], r.tables, r.lens).reshape(n, q.shape[1], -1)

    def prefill_layer(self, l, ch, q, k, v, pos):
        p = self.p
        st, bs, H = p.store, p.bs, p.H
        D = st.D
        start, end = ch.start, ch.start + len(ch.tokens)
        page = ch.lane * st.P + pos // bs
        st.k[l][page, :, pos % bs] = k
        st.v[l][page, :, pos % bs] = v
        npg = -(-end // bs)
        pk = st.k[l][ch.lane * st.P : ch.lane * st.P + npg]
        pv = st.v[l][ch.lane * st.P : ch.lane * st.P + npg]
        keys = pk.permute(1, 0, 2, 3).reshape(H, -1, D)[:, :end]
        vals = pv.permute(1, 0, 2, 3).reshape(H, -1, D)[:, :end]
        lo, hi = start // bs, end // bs  # blocks completed by this chunk
        if hi > lo and (st.kmin is not None or st.tok is not None):
            kb = keys[:, lo * bs : hi * bs].reshape(H, hi - lo, bs, D)
            ops.write_block_summaries(st, l, ch.lane, lo, kb, p.cfg.block_score)
        return causal_attn(q, keys, vals, start)

    def admit(self, lane, host_blocks) -> None:
        self.p.store.reset_lane(lane)

    def synthesize(self, a, g, layers) -> None:
        """The prompt's pages of each of ``layers`` filled with random K/V."""
        p = self.p
        st, dev = p.store, p.device
        pages = torch.arange(a.lane * st.P, a.lane * st.P + -(-a.prompt_len // p.bs), device=dev)
        shape = (pages.numel(), p.H, p.bs, st.D)
        for l in layers:
            st.k[l][pages] = torch.randn(shape, generator=g, device=dev).to(p.dtype)
            st.v[l][pages] = torch.randn(shape, generator=g, device=dev).to(p.dtype)
