"""The window family: a hybrid model's sliding-window layers (``ModelSpec.layer_windows``), whatever the mode.

A sliding layer keeps a ring of each lane's last ``W`` (+ drafts) tokens on the GPU (``oasis_exec.kv.ring``) and
attends it densely: no pages, host copy, summaries, selection or transfer. Every query row's K/V goes into the ring
(a draft row's too: the real token rewrites its slot the next step), so a verification pass is the ordinary layer
and its commit has nothing to keep (a rejected draft's slot is rewritten later).
"""

from __future__ import annotations

import torch

from .base import WorkingSet


class WindowSet(WorkingSet):
    family = "window"

    def __init__(self, parts, ring):
        super().__init__(parts)
        self.ring = ring  # kv.ring.RingKV

    def layer(self, l, s, r, q, k, v):
        """q [B, nq, Hq, D], k/v [B, nq, H, D] -> attn [B * nq, Hq, D]."""
        p2 = s.positions.view(s.B, s.nq)
        self.ring.write(l, s.lanes, p2, k, v)
        return self.ring.attend(l, q, s.lanes, p2).reshape(s.B * s.nq, q.shape[2], -1)

    def prefill_layer(self, l, ch, q, k, v, pos):
        return self.ring.prefill(l, ch.lane, q, k, v, ch.start)

    def synthesize(self, a, g, layers) -> None:
        for l in layers:
            self.ring.k[l][a.lane] = torch.randn(self.ring.k[l][a.lane].shape, generator=g, device=self.p.device)
            self.ring.v[l][a.lane] = torch.randn(self.ring.v[l][a.lane].shape, generator=g, device=self.p.device)
