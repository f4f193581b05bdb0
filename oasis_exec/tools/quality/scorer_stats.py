"""Per block scorer (``oasis_core.block_scorers``): how much of the next query's true attention its top-K holds.

For one layer of one text, with the true next query ``q_{t+1}``, the current ``q_t`` and the context keys, per
scorer ``s`` and ``K`` (blocks of ``block_size``; the local block always resident and never selected):

- ``T^s_{t+1}``: the top-K of ``q_{t+1}`` by scorer ``s`` over the blocks complete at ``t + 1``; ``T^s_t`` likewise;
- *mass*: ``q_{t+1}``'s true softmax attention (per KV head: the mean over its query heads) in ``T^s_{t+1}`` + the
  local block; *best*: the same for the K blocks of most true mass (the ceiling of any scorer at that K);
- *recall*: the share of those best K blocks that ``T^s_{t+1}`` holds;
- *proxy*: ``|top-K^s(q_t over the blocks of t + 1) ∩ T^s_{t+1}| / K`` (the current query as the prediction);
- *adjacent*: ``|T^s_t ∩ T^s_{t+1}| / K``;
- *lookahead* (the caller's draft pass): ``|top-K^s(draft query) ∩ T^s_{t+1}| / K``, the draft run through
  ``T^s_t`` + the local block (``resident`` below gives the caller ``T^s_t``).

Every value is the mean over positions and KV heads; callers average layers and texts. ``bases`` adds per-token
scorers (``oasis_core.token_scorer``): name -> basis [Hkv, D, r]; their scores count the tokens the query attends.
"""

from __future__ import annotations

import torch

from oasis_core import token_scorer
from oasis_core.block_scorers import build, score
from oasis_core.scoring import topk_blocks

from . import metrics

SCORER_STATS = ("mass", "best", "recall", "proxy", "adjacent")


def topk(q, summaries, scorer: str, k: int, n_blocks, scale=None, n_tokens=None):
    """Top-k per KV head: q [P, Hq, D]; summaries (a, b) each [Hkv, NB, D], or (projected keys [Hkv, NB, bs, r],
    basis) of a per-token scorer with ``n_tokens`` [P]; n_blocks [P] -> int64 [P, Hkv, k]."""
    a, b = summaries
    if a.dim() == 4:  # per-token: one row per position (each its own token count)
        s = token_scorer.score(q.float(), a[None].expand(q.shape[0], *a.shape), b, n_tokens, scale)
    else:
        s = score(q.float(), a[None], b[None], scorer, scale)  # [P, Hkv, NB]
    p_, h, nb = s.shape
    return topk_blocks(s.reshape(p_ * h, nb), k, n_blocks.repeat_interleave(h)).view(p_, h, k)


class LayerScorers:
    """One layer's summaries per scorer and the statistics above. k_l: [T, Hkv, D] context keys; mass: [P, Hkv, NB]
    the true block mass of ``q_{t+1}`` (``metrics.block_mass``); ts: int64 [P] positions t."""

    def __init__(self, scorers, k_l, block_size: int, scale=None, bases=None):
        keys = k_l.float().transpose(0, 1)  # [Hkv, T, D]
        bases = bases or {}
        self.summ = {s: build(keys, block_size, s) for s in scorers if s not in bases}
        self.summ.update({s: (token_scorer.build(keys, b.float(), block_size), b.float()) for s, b in bases.items()})
        self.bs, self.scale = block_size, scale

    def stats(self, scorer: str, k: int, q_cur, q_next, mass, ts) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """(statistics, T^s_t [P, Hkv, k], T^s_{t+1} [P, Hkv, k])."""
        bs = self.bs
        nb_t, nb_t1 = ts // bs + 1, (ts + 1) // bs + 1
        sm = self.summ[scorer]
        tn = topk(q_next, sm, scorer, k, nb_t1, self.scale, ts + 2)
        tc = topk(q_cur, sm, scorer, k, nb_t, self.scale, ts + 1)
        px = topk(q_cur, sm, scorer, k, nb_t1, self.scale, ts + 1)
        p_, h, nb = mass.shape
        best = topk_blocks(mass.reshape(p_ * h, nb), k, nb_t1.repeat_interleave(h)).view(p_, h, k)
        local = (ts + 1) // bs
        out = {
            "mass": metrics.captured_mass(mass, tn, local).mean().item(),
            "best": metrics.captured_mass(mass, best, local).mean().item(),
            "recall": metrics.set_overlap(tn, best).mean().item(),
            "proxy": metrics.set_overlap(px, tn).mean().item(),
            "adjacent": metrics.set_overlap(tc, tn).mean().item(),
        }
        return out, tc, tn

    def agreement(self, scorer: str, k: int, q_draft, t_next, ts) -> float:
        """Lookahead agreement of draft queries [P, Hq, D] with ``T^s_{t+1}`` [P, Hkv, k]."""
        pred = topk(q_draft, self.summ[scorer], scorer, k, (ts + 1) // self.bs + 1, self.scale, ts + 2)
        return metrics.set_overlap(pred, t_next).mean().item()
