"""The per-token block scorer (``oasis_core.token_scorer``) in the engine's layout: plain torch, no Triton kernel yet.

Storage (per layer, beside the min/max summaries it would replace): ``kp`` [n_seats, Hkv, Nmax, block_size, r], each
token's key projected on the layer's basis (``basis`` [Hkv, D, r]) when it is appended (``project_keys``), so a block's
summary is complete as its tokens arrive and the local block's tokens count too. bf16 at r = D / 4: twice the min/max
summaries' bytes (issue 38's ceiling).

``token_score(q, kp, basis, n_tokens, seat=None, exclude_local=True, scale=None, sink=True)``: q [B, Hq, D],
``n_tokens`` int [B] (each request's context), ``seat`` int [B] (its row of ``kp``; default the batch index). fp32
[B, Hkv, Nmax], ``-inf`` past the eligible blocks (``ceil(n_tokens / block_size)``, less the local block with
``exclude_local``), as ``block_score``'s. The formula is ``oasis_core.token_scorer.score`` over the seat's rows: one
matmul of the projected queries against every token's r values, a log-sum-exp per block, a log-softmax per query head
over the blocks and a log-sum-exp over the group (tests/unit/test_kernels_token_scorer.py). A fused kernel would read
``kp`` once per KV head (as ``block_score_any`` reads the summaries) and needs a second pass for each head's
normaliser (or the per-head scores written out): not written; ``bench_token_score`` times this reference on the GPU.
"""

from __future__ import annotations

import math

import torch

from oasis_core import token_scorer


def project_keys(k, basis):
    """k [M, Hkv, D] -> [M, Hkv, r]: what the KV append writes into ``kp`` for each new token."""
    return torch.einsum("mhd,hdr->mhr", k.float(), basis.float()).to(k.dtype)


def token_score(q, kp, basis, n_tokens, seat=None, exclude_local=True, scale=None, sink=True):
    """Block scores of the engine's batch (see the module doc)."""
    B = q.shape[0]
    bs, nmax = kp.shape[3], kp.shape[2]
    idx = seat.long() if seat is not None else torch.arange(B, device=q.device)
    s = token_scorer.score(q.float(), kp[idx].float(), basis.float(), n_tokens.long(), scale, sink)
    limit = (n_tokens.long() + bs - 1) // bs - (1 if exclude_local else 0)
    ok = torch.arange(nmax, device=q.device)[None, :] < limit[:, None]
    return torch.where(ok[:, None, :], s, torch.full_like(s, -math.inf))


def bench_token_score(batch=44, n_q_heads=32, n_kv_heads=8, head_dim=128, context=16384, rank=32, block_size=16):
    """Time of ``token_score`` on the GPU at a shape (bf16 storage), and the bytes it reads of ``kp``."""
    from triton.testing import do_bench

    dev = torch.device("cuda")
    n = context // block_size
    kp = torch.randn(batch, n_kv_heads, n, block_size, rank, device=dev, dtype=torch.bfloat16)
    basis = torch.linalg.qr(torch.randn(n_kv_heads, head_dim, head_dim, device=dev))[0][..., :rank].contiguous()
    q = torch.randn(batch, n_q_heads, head_dim, device=dev, dtype=torch.bfloat16)
    nt = torch.full((batch,), context, dtype=torch.int32, device=dev)
    ms = do_bench(lambda: token_score(q, kp, basis, nt), warmup=10, rep=100)
    return dict(kernel="token_score (plain torch)", batch=batch, context=context, rank=rank, ms=ms,
                bytes=kp.numel() * 2)  # fmt: skip
