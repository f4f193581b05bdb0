"""Gemma 3's decoder-layer elementwise ops in one launch each (``oasis_exec.model.gemma3``'s plain-torch semantics).

A Gemma 3 layer in plain torch is ~80 small kernels beside its GEMMs and attention: six ``(1 + w)`` RMSNorms in
fp32 (~9 kernels each), RoPE on q and k, GELU. At decode batch sizes these launches are the step (Gemma 3 270M at
32K, 28 lanes: 5.05 ms a step against 2.27 for the same shapes through the Llama family's fused path). Here:

- ``norm1p(x, w1, eps)``: ``(xf * rsqrt(mean(xf^2) + eps) * w1).to(x.dtype)`` with ``xf = x.float()`` and ``w1 = 1 + w``
  in fp32 (``one_plus(w)``, made once at load): ``fused_ops``' RMSNorm kernel with its ``ONE_PLUS`` flag.
- ``post_norm_add(o, x, w1_post, w1_next, eps) -> (s, h)``: ``s = x + norm1p(o, w1_post)`` (each rounded to the
  dtype, as torch computes them) and ``h = norm1p(s, w1_next)``, one pass over the row (``w1_next`` None: ``s``
  only). It is the post-attention norm, the residual add and the pre-feed-forward norm of ``Gemma3Decoder.finish``,
  and its post-feed-forward norm and add.
- ``gelu_mul(gu)``: ``F.gelu(g, approximate="tanh") * u`` for gu = [gate | up], gelu rounded to the dtype first.
- q/k norm + RoPE + the query scale: ``fused_ops.qk_norm_rope(..., one_plus=True, q_scale=...)``.

The norms' sums run in another order than torch's, so fp32 results differ in the last bits and bf16 ones by at most
one rounding step where a value sits on a tie; ``tanh`` is computed as ``1 - 2 / (exp(2z) + 1)`` (a few fp32 ulp
from torch's). The references below are the model's expressions (tested equal to ``gemma3``'s).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._util import next_pow2
from .fused_ops import _RNE, _cast, _norm, _rows, _rstd, _warps, act_mul


def one_plus(w):
    """A Gemma norm weight as the kernels take it: ``1 + w`` in fp32, contiguous."""
    return (1.0 + w.float()).contiguous()


def norm1p(x, w1, eps):
    """Gemma's RMSNorm in one launch; ``w1 = one_plus(w)``. x [..., H] -> x.dtype."""
    return _norm(x, None, w1, eps, one_plus=True)


@triton.jit
def post_norm_add_kernel(
    O, X, WP, WN, S, Y, stride_o, stride_x, H, eps, HAS_NEXT: tl.constexpr, BLOCK: tl.constexpr, RNE: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < H
    of = tl.load(O + row * stride_o + offs, mask=m, other=0.0).to(tl.float32)
    wp = tl.load(WP + offs, mask=m, other=0.0)
    a = _cast(of * _rstd(of, H, eps) * wp, S.dtype.element_ty, RNE)
    x = tl.load(X + row * stride_x + offs, mask=m, other=0.0)
    s = _cast(x.to(tl.float32) + a.to(tl.float32), S.dtype.element_ty, RNE)
    tl.store(S + row * H + offs, s, mask=m)
    if HAS_NEXT:
        sf = s.to(tl.float32)
        wn = tl.load(WN + offs, mask=m, other=0.0)
        y = sf * _rstd(sf, H, eps) * wn
        tl.store(Y + row * H + offs, _cast(y, Y.dtype.element_ty, RNE), mask=m)


def post_norm_add(o, x, w1_post, w1_next, eps):
    """(s, h): ``s = x + norm1p(o, w1_post)``, ``h = norm1p(s, w1_next)`` (None when ``w1_next`` is None). o, x
    [N, H] of one dtype; the weights ``one_plus`` ones."""
    H = x.shape[-1]
    assert o.shape == x.shape and o.dtype == x.dtype, f"o {tuple(o.shape)} {o.dtype} vs x {tuple(x.shape)} {x.dtype}"
    assert w1_post.shape == (H,) and w1_post.dtype == torch.float32 and w1_post.stride(0) == 1
    o2, x2 = _rows(o, H), _rows(x, H)
    rows = x2.shape[0]
    s = torch.empty((rows, H), dtype=x.dtype, device=x.device)
    y = torch.empty((rows, H), dtype=x.dtype, device=x.device) if w1_next is not None else s
    if rows:
        BLOCK = next_pow2(H)
        post_norm_add_kernel[(rows,)](
            o2,
            x2,
            w1_post,
            w1_next if w1_next is not None else w1_post,
            s,
            y,
            o2.stride(0),
            x2.stride(0),
            H,
            float(eps),
            HAS_NEXT=w1_next is not None,
            BLOCK=BLOCK,
            RNE=_RNE,
            num_warps=_warps(BLOCK),
        )
    s = s.view(x.shape)
    return (s, y.view(x.shape)) if w1_next is not None else (s, None)


_GELU_K = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5  # torch's kBeta: sqrt(2 / pi)


def gelu_mul(gu):
    """gu [N, 2 m] (gate, then up) -> ``F.gelu(g, approximate="tanh") * u`` [N, m] in gu.dtype; one launch
    (``fused_ops.act_mul``'s GELU form)."""
    return act_mul(gu, _GELU_K)


# ------------------------------------------------------------------------------------------------- references


def norm1p_ref(x, w, eps):
    """``oasis_exec.model.gemma3.norm1p`` (w the checkpoint's, not ``1 + w``)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).to(x.dtype)


def post_norm_add_ref(o, x, w_post, w_next, eps):
    s = x + norm1p_ref(o, w_post, eps)
    return s, (norm1p_ref(s, w_next, eps) if w_next is not None else None)


def gelu_mul_ref(gu):
    g, u = gu.chunk(2, dim=-1)
    return torch.nn.functional.gelu(g, approximate="tanh") * u
