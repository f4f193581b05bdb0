"""What a resident set keeps after a verification pass's acceptance (``ResidentSet.commit``).

``n`` [B] int64 accepted drafts a lane, on the device (no host synchronisation). Draft j goes to the input's block
(phase 0) or, past its end, to the next block (phase 1), which reuses the local slot once the full block's summary
and host copy are taken (``k < block_size``: at most one block fills); with one draft (k = 1) a lane has one of the
two, and a block its input ended is already summarised and copied, so both are one phase. Every write is masked to the accepted run (a
masked-out draft goes to its row's trash slot, ``KVStore.TRASH``: one scatter a layer and phase, no read of the
slot first), so nothing of a rejected draft is written where a query reads. Then each layer's
background prediction for the next step, from the pass's query nearest the next step's position.
"""

from __future__ import annotations

import torch

from ..transfer.writeback import writeback_full


def commit_accepted(ws, s, n, sets, recorded) -> None:
    p = ws.p
    st, bs, H, dev = p.store, p.bs, p.H, p.device
    s.sets, s.recorded = sets, recorded
    lanes, pos, B = s.lanes, s.pos, s.B
    k = s.nq - 1
    j = torch.arange(1, k + 1, device=dev)
    b0 = pos // bs
    p_j = pos[:, None] + j  # [B, k]: the drafts' positions
    accepted = j <= n[:, None]
    base = st.slot_base(lanes)  # [B, H]
    local = base + st.LOCAL
    off = (p_j % bs)[:, None, :]  # [B, 1, k]: each draft's offset in its block
    hh = torch.arange(H, device=dev)
    src = local.reshape(-1).to(torch.int32)
    row = (lanes[:, None] * H + hh).reshape(-1).to(torch.int32)
    fill = pos % bs + 1 + n  # tokens of the input's block and beyond after the run
    ends = pos % bs == bs - 1  # the input token ends its block (the pass summarised and copied it)
    if k == 1:
        # one phase: a lane's one draft lies in the input's block or, when the input ends it, in the next; a block
        # the input ended was summarised and copied by the pass, so nothing reads the slot's old tokens after the
        # write (its summary below is the new block's, valid = the accepted draft)
        in_run = [accepted]
        blk_l = [b0 + ends.long()]
        valid_l = [torch.where(ends, fill - bs, fill)]
    else:
        in_run = [accepted & (p_j // bs == b0[:, None] + ph) for ph in (0, 1)]
        blk_l = [b0, b0 + 1]
        valid_l = [fill.clamp(max=bs), (fill - bs).clamp(min=0)]
    # a phase: [B, H, k] slots of its drafts (the local slot, or the row's trash slot for a draft not in the phase
    # or not accepted) and offsets; the items of its summary (the block and its valid tokens a row)
    trash = (base + st.TRASH)[:, :, None]
    phases = [
        (
            (torch.where(w[:, None, :], local[:, :, None], trash).long(), off),
            bk.repeat_interleave(H).to(torch.int32),
            v.repeat_interleave(H).to(torch.int32),
        )
        for w, bk, v in zip(in_run, blk_l, valid_l)
    ]
    wb_dst = (st.host_table[lanes, b0][:, None] * H + hh).reshape(-1).to(torch.int32)
    filled = (fill >= bs) & ~ends  # the run (not the input token: the pass copied it) filled it
    wb_len = torch.where(filled, bs, 0).repeat_interleave(H).to(torch.int32)
    sel = torch.clamp(n + 1, max=k)  # the pass's query nearest the next step's position p + n + 1
    qrow = torch.arange(B, device=dev)
    nb_next = (pos + n + 1) // bs + 1
    for l, (q, ek, ev) in s.saved.items():  # ek, ev [B, H, k, D]
        for ph, (at, blk, valid) in enumerate(phases):
            st.k[l].index_put_(at, ek)
            st.v[l].index_put_(at, ev)
            ws._summarize(l, src, row, blk, valid)  # no-op for a row with no token in the block
            if ph == 0:  # a block filled by the run: its host copy before the slot holds the next one
                sc = ws._scales(l)
                writeback_full(st.k[l], st.v[l], p.host.k[l], p.host.v[l], src, wb_dst, wb_len, bs, sc)
        if p.cfg.mode_spec.background and ws.spec_pipe is not None:  # spec_predict beside: the repair only
            ws.spec_pipe.repair(l, q, n, pos, lanes, s.rows, sets, recorded)
        elif p.cfg.mode_spec.background:
            given = sets[1][:, l] if sets is not None else None
            ws._launch_prediction(l, q[qrow, sel], given, s, nb_next)
