"""A resident set's first working set after a real prefill (``ResidentSet.prefill_done``).

The local block comes from the prompt's tail; the first step's top-K from the last prompt token's query, copied from
the prompt KV scratch into the first K slots (a hot cache's other slots start empty). A short lane instead holds
block j in its slot j, the tail included: with K + 1 full blocks (a prompt of exactly the window) block K is in the
local slot, where the crossing (the next step) finds it. With an fp8 host copy the fetched-without-a-fetch blocks
are rounded through the quantization (what the host copy reads back as).
"""

from __future__ import annotations

import torch

from oasis_core.scoring import topk_blocks
from oasis_core.selection import initial_plan

from ..kv.host_quant import roundtrip


def first_working_set(ws, ch, q_last: dict, n_tok: int, short_lane: bool) -> None:
    """``q_last``: {layer: the last prompt token's query [Hq, D]} of the set's layers."""
    p = ws.p
    st, bs, H, dev, K = p.store, p.bs, p.H, p.device, p.K
    sk, sv = ws.scratch[ch.req_id]
    lane = torch.tensor([ch.lane], device=dev)
    base = st.slot_base(lane)[0]  # [H]
    rows = slice(ch.lane * H, (ch.lane + 1) * H)
    if short_lane:
        n_slots = -(-n_tok // bs)  # blocks holding the prompt, the partial tail included; at most K + 1
        dst = (base[:, None] + torch.arange(n_slots, device=dev)).reshape(-1)
        n_full = min(n_tok // bs, K)
        for l in q_last:
            kb = torch.zeros(H, n_slots * bs, sk.shape[-1], dtype=sk.dtype, device=dev)
            vb = torch.zeros_like(kb)
            kb[:, :n_tok], vb[:, :n_tok] = sk[l, :, :n_tok], sv[l, :, :n_tok]
            st.k[l][dst] = kb.view(H * n_slots, bs, -1)
            st.v[l][dst] = vb.view(H * n_slots, bs, -1)
            st.resident[l, rows, :n_full] = torch.arange(n_full, device=dev)
            st.last_sel[l, rows, :n_full] = 0
        return
    tail0 = (n_tok // bs) * bs
    nb = tail0 // bs + 1  # blocks incl. the (possibly empty) local one
    m = n_tok - tail0
    dst = (base[:, None] + torch.arange(K, device=dev)).reshape(-1)
    for l, q in q_last.items():
        if m:
            st.k[l][base + st.LOCAL, :m] = sk[l, :, tail0:n_tok]
            st.v[l][base + st.LOCAL, :m] = sv[l, :, tail0:n_tok]
        nbt = torch.tensor([nb], dtype=torch.int32, device=dev)
        scores = p.selector.scores(l, q[None], nbt, lane.to(torch.int32))
        pred = topk_blocks(scores.view(H, -1), K, torch.full((H,), nb, device=dev))  # [H, K]
        plan = initial_plan(pred, step=0, slots=st.S)  # the first K slots; a hot cache's others start empty
        st.resident[l, rows] = plan.resident
        st.last_sel[l, rows] = plan.last_sel
        blk = plan.resident[:, :K].clamp(min=0)  # [H, K]: fetch_slot j == j
        tok = blk[:, :, None] * bs + torch.arange(bs, device=dev)  # [H, K, bs]
        kk = torch.gather(sk[l], 1, tok.reshape(H, -1, 1).expand(-1, -1, sk.shape[-1]))
        vv = torch.gather(sv[l], 1, tok.reshape(H, -1, 1).expand(-1, -1, sv.shape[-1]))
        kk, vv = kk.reshape(H * K, bs, -1), vv.reshape(H * K, bs, -1)
        if p.host.quantized:  # what the host copy reads back as (the prefill just wrote it quantized)
            kk, vv = roundtrip(kk), roundtrip(vv)
        st.k[l][dst] = kk
        st.v[l][dst] = vv
