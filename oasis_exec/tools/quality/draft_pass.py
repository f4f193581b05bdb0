"""The draft token's forward, as the engine runs it: row p is the draft token ``d_{t_p + 1}`` at position
``t_p + 1``, propagated through the target's layers beside the real token of step ``t_p``.

At each layer the draft query attends a masked view of the context keys ``0 .. t_p`` (K/V from the dense,
teacher-forced forward) plus its own K/V:

- ``resident_mask``: the engine's view, per KV head: the resident blocks of step ``t_p`` (their top-K) and the local
  block (the tokens of block ``t_p // block_size`` up to ``t_p``);
- ``dense_mask``: every token ``<= t_p``.

On a sliding layer (Gemma 3) every row attends its window (``layer_window``), as the target's forward does.

``DraftPass.layer`` returns the layer's draft query (what lookahead scores against the summaries) and advances the
rows through the layer.
"""

from __future__ import annotations

import math

import torch


def dense_mask(t, n_ctx: int):
    """bool [P, 1, n_ctx]: row p sees context tokens ``0 .. t[p]``."""
    return (torch.arange(n_ctx, device=t.device)[None, :] <= t[:, None])[:, None, :]


def resident_mask(resident, t, n_ctx: int, block_size: int):
    """bool [P, H, n_ctx]: the tokens of the blocks ``resident`` [P, H, K] (ids, -1 = none) and of the local block
    ``t // block_size`` up to ``t`` [P]."""
    p_, h, _ = resident.shape
    nb = -(-n_ctx // block_size)
    blocks = torch.zeros(p_, h, nb + 1, dtype=torch.bool, device=resident.device)  # column nb absorbs -1
    blocks.scatter_(-1, torch.where(resident >= 0, resident, nb), True)
    block_of = torch.arange(n_ctx, device=t.device) // block_size  # [n_ctx]
    tok = blocks[..., :nb][..., block_of]  # [P, H, n_ctx]
    local = (block_of[None, :] == (t // block_size)[:, None]) & (
        torch.arange(n_ctx, device=t.device)[None, :] <= t[:, None]
    )
    return (tok | local[:, None, :]) & dense_mask(t, n_ctx)


def draft_attention(q, k_self, v_self, k_ctx, v_ctx, mask):
    """fp32 softmax attention of draft queries over masked context keys plus their own key.

    q: [R, Hq, D]; k_self, v_self: [R, Hkv, D]; k_ctx, v_ctx: [T, Hkv, D]; mask: bool [R, Hkv or 1, T].
    Returns [R, Hq, D] in q's dtype."""
    r, hq, d = q.shape
    hk = k_self.shape[1]
    qg = q.float().view(r, hk, hq // hk, d)
    s_ctx = torch.einsum("rhgd,thd->rhgt", qg, k_ctx.float()) / math.sqrt(d)
    s_ctx = s_ctx.masked_fill(~mask[:, :, None, :], float("-inf"))
    s_self = torch.einsum("rhgd,rhd->rhg", qg, k_self.float())[..., None] / math.sqrt(d)
    p = torch.softmax(torch.cat([s_ctx, s_self], -1), -1)
    out = torch.einsum("rhgt,thd->rhgd", p[..., :-1], v_ctx.float()) + p[..., -1:] * v_self.float()[:, :, None]
    return out.reshape(r, hq, d).to(q.dtype)


class DraftPass:
    """Rows of draft tokens ``tokens`` [R] at positions ``pos`` [R] (= t + 1), advanced one target layer at a time."""

    def __init__(self, dec, tokens, pos):
        self.dec = dec
        self.pos = pos.to(dec.device)
        self.x = dec.embed_tokens(tokens.to(dec.device))

    @torch.no_grad()
    def layer(self, i: int, k_ctx, v_ctx, mask):
        """Layer ``i``: returns the draft query [R, Hq, D] (RoPE applied) and moves the rows past the layer.
        k_ctx, v_ctx: [T, Hkv, D] context K/V of layer ``i``; mask: bool [R, Hkv or 1, T]. A sliding layer (Gemma 3)
        attends its window whatever ``mask`` says: the engine selects blocks on full layers only."""
        w = self.dec.shape.layer_window(i)
        if w is not None:  # position p sees p - W + 1 .. p
            n = k_ctx.shape[0]
            mask = (
                dense_mask(self.pos - 1, n) & (torch.arange(n, device=self.pos.device) > self.pos[:, None] - w)[:, None]
            )
        q, k, v = self.dec.qkv(i, self.x, self.pos)
        attn = draft_attention(q, k, v, k_ctx, v_ctx, mask)
        self.x = self.dec.finish(i, self.x, attn)
        return q
