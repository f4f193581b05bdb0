"""The step's top-K blocks of a layer: block scores against the summaries, then the top-K or the given sets.

``Selector.predict`` is what every selecting mode runs (quest's pages, retrieval's and hisparse's on-demand fetch, the
background modes' prediction for the next step); the scores always run, so that synthetic and replayed selections
pay for them as ``selection=model`` does.
"""

from __future__ import annotations

import torch

from oasis_core.scoring import topk_blocks

from .. import ops


class Selector:
    def __init__(self, *, store, top_k: int, n_kv_heads: int, block_score: str, topk_kernel: str, synthetic_topk):
        self.store, self.K, self.H = store, top_k, n_kv_heads
        self.block_score, self.topk_kernel, self.synthetic_topk = block_score, topk_kernel, synthetic_topk

    def scores(self, l, q, n_blocks, lanes32):
        """Layer ``l``'s block scores [B, H, N] of queries ``q`` [B, Hq, D] (``ops.block_score``; the per-token
        scorer's ``ops.token_score`` when the store holds its storage, ``block_score=tokens``)."""
        st = self.store
        if st.tok is not None:
            return st.tok.score(l, q.contiguous(), n_blocks, lanes32)
        return ops.block_score(q.contiguous(), st.kmin[l], st.kmax[l], n_blocks, lanes32, self.block_score)

    def predict(self, l, qsel, lanes32, n_blocks, src, recorded=None):
        """The top-K blocks per row [B * H, K] of layer ``l``: scored from ``qsel`` [B, Hq, D] against the summaries
        (always run, so synthetic runs pay for it), then taken from the selection source ``src`` (given sets) or the
        scores' top-K (``synthetic_topk``: the top-K of the scores is run for synthetic sets too, as selection=model
        runs it). ``recorded``: a list the prediction is appended to (``--record-path``)."""
        scores = self.scores(l, qsel, n_blocks.to(torch.int32), lanes32)
        B = qsel.shape[0]
        rows = scores.view(B * self.H, -1)
        if src is not None:
            pred = src.reshape(B * self.H, -1)
            if self.synthetic_topk:  # the work selection=model does here; its result is not used
                self.topk(rows, n_blocks)
        else:
            pred = self.topk(rows, n_blocks)
        if recorded is not None:
            recorded.append(pred)
        return pred

    def topk(self, scores, n_blocks):
        """The top-K block ids [B * H, K] of ``scores`` [B * H, N] (``ExecConfig.topk_kernel``: the torch sort of
        ``oasis_core.scoring.topk_blocks``, or ``oasis_kernels.topk_select``'s one launch; the same ids)."""
        if self.topk_kernel == "fused":
            return ops.topk_select(scores, self.K, n_blocks, self.H)
        return topk_blocks(scores, self.K, n_blocks.repeat_interleave(self.H))
