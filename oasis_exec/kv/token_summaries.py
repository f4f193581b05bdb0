"""The per-token scorer's storage (``block_score=tokens``, ``oasis_core.token_scorer``), held in place of the min/max
summaries by either store.

Per full layer: ``kp`` [B_max, H, NB_max, bs, r] (the KV dtype), every token's ``r`` kept key channels, and ``chan``
[H, r] int32, which channels (a fitted basis's RoPE pairs, ``ExecConfig.token_basis``, else the first ``r / 2``
pairs). GPU bytes: ``bs * r * s`` a block and KV head (``KVGeometry.token_rank``), i.e. ``2 r`` a token in bf16; at
r = D / 4, twice the min/max summaries' ``2 D * s / bs``. Written as the min/max summaries are: whole blocks at prefill
(``write_blocks``), the items of a decode step (the block a token entered, ``update``: ``oasis_kernels.token_update``);
scored by ``oasis_kernels.token_score`` (``score``). A lane's entries are zeroed at admission.
"""

from __future__ import annotations

import numpy as np
import torch

from oasis_core.token_scorer import engine_rank, first_pairs

from .layer_table import table


def load_channels(path, layers, rank: int, n_kv_heads: int, head_dim: int) -> dict:
    """Channel ids {layer: [H, r] int32} of ``layers``: ``L{layer}_pairs{rank}`` of a ``fit_basis.py`` .npz, or
    with ``path`` None the first ``rank / 2`` RoPE pairs of every head."""
    if path is None:
        return {l: first_pairs(n_kv_heads, head_dim, rank) for l in layers}
    z = np.load(path)
    out = {}
    for l in layers:
        key = f"L{l}_pairs{rank}"
        if key not in z.files:
            raise ValueError(f"token_basis: {path} has no {key} (layers {list(layers)}, token_rank {rank})")
        ch = np.asarray(z[key], dtype=np.int32)
        if ch.shape != (n_kv_heads, rank) or ch.min() < 0 or ch.max() >= head_dim:
            raise ValueError(f"token_basis: {key} must be [{n_kv_heads}, {rank}] ids < {head_dim}, got {ch.shape}")
        out[l] = ch
    return out


class TokenSummaries:
    def __init__(self, n_layers, layers, max_lanes, n_kv_heads, max_blocks, block_size, head_dim, cfg, dtype, device):
        self.r = engine_rank(head_dim, cfg.token_rank)
        self.H, self.bs = n_kv_heads, block_size
        self.kp = table(
            n_layers, layers, (max_lanes, n_kv_heads, max_blocks, block_size, self.r), 0, dtype, device, "kp"
        )
        self.chan = table(n_layers, layers, (n_kv_heads, self.r), 0, torch.int32, device, "chan")
        for l, ch in load_channels(cfg.token_basis, layers, self.r, n_kv_heads, head_dim).items():
            self.chan[l] = torch.as_tensor(ch, device=device)

    def write_blocks(self, l, lane: int, lo: int, kb) -> None:
        """Whole blocks ``lo ..`` of ``lane`` from their keys ``kb`` [H, n, bs, D] (prefill)."""
        ch = self.chan[l].long()[:, None, None, :].expand(*kb.shape[:3], self.r)
        self.kp[l, lane, :, lo : lo + kb.shape[1]] = kb.gather(-1, ch).to(self.kp.dtype)

    def update(self, l, k_src, src, dst_row, dst_block, n_valid) -> None:
        """The items' blocks (``ops.summary_update``'s items: ``k_src`` [N, bs, D] source blocks, rows
        ``lane * H + head``) into layer ``l``'s ``kp``."""
        from .. import ops

        ops.token_update(k_src, src, dst_row, dst_block, n_valid, self.kp[l], self.chan[l])

    def score(self, l, q, n_blocks, seat):
        """Layer ``l``'s block scores [B, H, NB] fp32 (``ops.token_score``)."""
        from .. import ops

        return ops.token_score(q, self.kp[l], self.chan[l], n_blocks, seat)

    def reset_lane(self, lane: int) -> None:
        self.kp[:, lane] = 0
