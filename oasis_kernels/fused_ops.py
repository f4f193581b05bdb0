"""Fused elementwise ops of the decoder layer: RMSNorm, residual add + RMSNorm, q/k norm + RoPE + v copy, SwiGLU.

The dense decode step is launch-bound at small batch: plain torch spends ~8 kernels on one RMSNorm and ~20 on RoPE.
Each op here is one launch, with the plain-torch semantics of ``oasis_exec.model.decoder`` (the references below are the
same expressions):

- ``rms_norm(x, w, eps)``: ``(xf * rsqrt(mean(xf^2) + eps)).to(x.dtype) * w`` with ``xf = x.float()``. x
  ``[..., H]`` (last dim contiguous; 2-d rows may be strided), w ``[H]``. One program per row, the whole row in one
  block (``next_pow2(H)`` lanes, masked), fp32 accumulation.
- ``add_rms_norm(x, r, w, eps) -> (s, normed)``: ``s = x + r`` rounded to x.dtype (as torch computes it) and
  ``normed = rms_norm(s, w, eps)``, one pass.
- ``qk_norm_rope(y, pos, hq, hk, d, q_w, k_w, eps, theta) -> (q, k, v)``: y ``[N, (hq + 2 hk) d]`` is the fused qkv
  GEMM output (last dim contiguous); q ``[N, hq, d]``, k ``[N, hk, d]`` get the optional per-head RMSNorm (Qwen3's
  q/k norm; ``None`` = none, as Llama) and then rotate-half RoPE at ``pos [N]``; v ``[N, hk, d]`` is a contiguous
  copy. One program per (token, head) over the ``hq + 2 hk`` heads.
- ``silu_mul(gu) -> silu(g) * u``: gu ``[N, 2 m]`` is the gate_up GEMM output, gate first; silu is rounded to the
  dtype before the multiply, as ``F.silu(g) * u`` does. ``act_mul(gu, gelu_k)`` is the same kernel with GELU's tanh
  form instead (Gemma 3: ``gemma_ops.gelu_mul``).
- Gemma 3's norms (``gemma_ops``): ``rms_norm_kernel`` and ``qk_norm_rope`` with ``ONE_PLUS`` (the weight holds
  ``1 + w`` in fp32 and the product rounds once) and ``qk_norm_rope``'s ``q_scale``.

RoPE numerics. ``inv_freq = 1 / theta ** (arange(0, d, 2) / d)`` is computed by torch on the target device
(:func:`rope_inv_freq`, cached), so it is bit-identical to the reference's. The angle ``pos.float() * inv_freq``
is one rounded fp32 multiply as in torch (at positions of tens of thousands one fp32 ulp of the angle is ~4e-3
rad, so how it is rounded matters more than cos/sin). ``tl.cos``/``tl.sin`` (no libdevice) are accurate at such
angles: on the H200 they equal torch's cos/sin bit for bit at positions up to 200K (d = 128, theta = 1e6), and
numpy's (the interpreter) are within 1 ulp. The kernel is launched with ``enable_fp_fusion=False`` so no FMA
contraction changes the rounding of the angle or of ``x1 * cos - x2 * sin``: with fp32 inputs on CUDA the result is
then the reference's bit for bit up to the q/k norm's reduction order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreting
from ._util import HBM_ROOFLINE_GBPS, cdiv, next_pow2

_RNE = interpreting()  # fixed at package import, like the interpreter switch itself


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))


@triton.jit
def _cast(x, dtype: tl.constexpr, RNE: tl.constexpr):
    """``x.to(dtype)``. Triton 3.6's interpreter truncates fp32 -> bf16 instead of rounding to nearest even as the
    GPU (and torch) do; with ``RNE`` (set when interpreting) bf16 is rounded here with integer ops instead."""
    if RNE:
        if dtype == tl.bfloat16:
            u = x.to(tl.float32).to(tl.uint32, bitcast=True)
            u = u + (0x7FFF + ((u >> 16) & 1))
            return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            return x.to(dtype)
    else:
        return x.to(dtype)


# --------------------------------------------------------------------------------------------- RMSNorm (+ residual)


@triton.jit
def _rstd(xf, H, eps):
    """``1 / sqrt(mean(xf^2) + eps)`` of a row held in fp32 (masked lanes zero), as the norms compute it."""
    return 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / H + eps)


@triton.jit
def rms_norm_kernel(
    X,
    R,
    W,
    S,
    Y,
    stride_x,
    stride_r,
    H,
    eps,
    HAS_R: tl.constexpr,
    BLOCK: tl.constexpr,
    RNE: tl.constexpr,
    ONE_PLUS: tl.constexpr = False,
):
    """Row ``program_id`` of X (and R); S and Y are contiguous [rows, H]. ONE_PLUS: Gemma's norm, ``xf * rstd * W``
    in fp32 rounded once (W holds ``1 + w`` in fp32), instead of rounding ``xf * rstd`` before the weight."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < H
    x = tl.load(X + row * stride_x + offs, mask=m, other=0.0)
    if HAS_R:
        r = tl.load(R + row * stride_r + offs, mask=m, other=0.0)
        x = _cast(x.to(tl.float32) + r.to(tl.float32), S.dtype.element_ty, RNE)
        tl.store(S + row * H + offs, x, mask=m)
    xf = x.to(tl.float32)
    rstd = _rstd(xf, H, eps)
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    if ONE_PLUS:
        n = xf * rstd
    else:
        n = _cast(xf * rstd, X.dtype.element_ty, RNE).to(tl.float32)
    tl.store(Y + row * H + offs, _cast(n * w, Y.dtype.element_ty, RNE), mask=m)


def _rows(t, H):
    """``t`` as [rows, H] with a unit inner stride (rows may be strided; copies only when it must)."""
    if t.dim() == 2 and (t.stride(1) == 1 or H == 1):
        return t
    t2 = t.reshape(-1, H)
    return t2 if t2.stride(1) == 1 or H == 1 else t2.contiguous()


def _norm(x, r, w, eps, one_plus=False):
    # Lean on purpose: outside CUDA graphs (prefill, eager steps) the host cost of this wrapper is per launch.
    H = x.shape[-1]
    assert w.dim() == 1 and w.shape[0] == H and w.stride(0) == 1, f"w must be contiguous [{H}], got {tuple(w.shape)}"
    x2 = _rows(x, H)
    rows = x2.shape[0]
    same = one_plus or w.dtype == x.dtype  # Gemma's norm returns x's dtype whatever its (fp32) weight's
    y = torch.empty((rows, H), dtype=x.dtype if same else torch.promote_types(x.dtype, w.dtype), device=x.device)
    s, r2 = y, x2
    if r is not None:
        assert r.shape == x.shape and r.dtype == x.dtype, (
            f"r {tuple(r.shape)} {r.dtype} vs x {tuple(x.shape)} {x.dtype}"
        )
        r2 = _rows(r, H)
        s = torch.empty((rows, H), dtype=x.dtype, device=x.device)
    if rows:
        BLOCK = next_pow2(H)
        rms_norm_kernel[(rows,)](
            x2,
            r2,
            w,
            s,
            y,
            x2.stride(0),
            r2.stride(0),
            H,
            float(eps),
            HAS_R=r is not None,
            BLOCK=BLOCK,
            RNE=_RNE,
            ONE_PLUS=one_plus,
            num_warps=_warps(BLOCK),
        )
    if x.dim() != 2:
        y, s = y.view(x.shape), s.view(x.shape)
    return y if r is None else (s, y)


def rms_norm(x, w, eps):
    """``(x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype) * w`` in one launch. x [..., H], w [H]."""
    return _norm(x, None, w, eps)


def add_rms_norm(x, r, w, eps):
    """``s = x + r`` (x.dtype) and ``rms_norm(s, w, eps)`` in one launch. Returns ``(s, normed)``."""
    return _norm(x, r, w, eps)


def rms_norm_ref(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def add_rms_norm_ref(x, r, w, eps):
    s = x + r
    return s, rms_norm_ref(s, w, eps)


# --------------------------------------------------------------------------------------- q/k norm + RoPE + v copy

_INV_FREQ = {}


def rope_inv_freq(d: int, theta: float, device) -> torch.Tensor:
    """``1 / theta ** (arange(0, d, 2) / d)`` in fp32 on ``device``, computed by torch exactly as the reference RoPE
    does (so bit-identical on the same device); cached per (d, theta, device)."""
    device = torch.device(device)
    key = (int(d), float(theta), device)
    t = _INV_FREQ.get(key)
    if t is None:
        t = _INV_FREQ[key] = 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    return t


@triton.jit
def qk_norm_rope_kernel(
    Y,
    POS,
    QW,
    KW,
    INV,
    Q,
    K,
    V,
    stride_y,
    HQ,
    HK,
    eps,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_NORM: tl.constexpr,
    RNE: tl.constexpr,
    ONE_PLUS: tl.constexpr = False,
    Q_SCALE: tl.constexpr = 1.0,
):
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    m = offs < HALF
    src = Y + n * stride_y + h * (2 * HALF)
    x1 = tl.load(src + offs, mask=m, other=0.0)
    x2 = tl.load(src + HALF + offs, mask=m, other=0.0)
    if h >= HQ + HK:  # a v head: plain copy
        dst_v = V + (n * HK + (h - HQ - HK)) * (2 * HALF)
        tl.store(dst_v + offs, x1, mask=m)
        tl.store(dst_v + HALF + offs, x2, mask=m)
    else:
        if h < HQ:
            dst = Q + (n * HQ + h) * (2 * HALF)
            wp = QW
        else:
            dst = K + (n * HK + (h - HQ)) * (2 * HALF)
            wp = KW
        xf1 = x1.to(tl.float32)
        xf2 = x2.to(tl.float32)
        if HAS_NORM:  # rms_norm over the head, rounded to the dtype, times w, rounded (as rms_norm_ref)
            rstd = 1.0 / tl.sqrt((tl.sum(xf1 * xf1, 0) + tl.sum(xf2 * xf2, 0)) / (2 * HALF) + eps)
            w1 = tl.load(wp + offs, mask=m, other=0.0).to(tl.float32)
            w2 = tl.load(wp + HALF + offs, mask=m, other=0.0).to(tl.float32)
            if ONE_PLUS:  # Gemma's: xf * rstd * (1 + w) in fp32 (w holds 1 + w), rounded once
                xf1 = _cast(xf1 * rstd * w1, Q.dtype.element_ty, RNE).to(tl.float32)
                xf2 = _cast(xf2 * rstd * w2, Q.dtype.element_ty, RNE).to(tl.float32)
            else:
                xf1 = _cast(_cast(xf1 * rstd, Y.dtype.element_ty, RNE).to(tl.float32) * w1, Q.dtype.element_ty, RNE).to(
                    tl.float32
                )
                xf2 = _cast(_cast(xf2 * rstd, Y.dtype.element_ty, RNE).to(tl.float32) * w2, Q.dtype.element_ty, RNE).to(
                    tl.float32
                )
        p = tl.load(POS + n).to(tl.float32)
        inv = tl.load(INV + offs, mask=m, other=0.0)
        ang = p * inv  # one rounded fp32 multiply, as torch (the launch disables FMA contraction)
        c = tl.cos(ang)
        s = tl.sin(ang)
        r1 = _cast(xf1 * c - xf2 * s, Q.dtype.element_ty, RNE)
        r2 = _cast(xf2 * c + xf1 * s, Q.dtype.element_ty, RNE)
        if Q_SCALE != 1.0:  # Gemma's query_pre_attn_scalar: q times a constant after RoPE, rounded again
            if h < HQ:
                r1 = _cast(r1.to(tl.float32) * Q_SCALE, Q.dtype.element_ty, RNE)
                r2 = _cast(r2.to(tl.float32) * Q_SCALE, Q.dtype.element_ty, RNE)
        tl.store(dst + offs, r1, mask=m)
        tl.store(dst + HALF + offs, r2, mask=m)


def qk_norm_rope(
    y, pos, hq, hk, d, q_w=None, k_w=None, eps=1e-6, theta=10000.0, inv_freq=None, one_plus=False, q_scale=1.0
):
    """y [N, (hq + 2 hk) d] -> q [N, hq, d], k [N, hk, d] (optional per-head RMSNorm, then RoPE at ``pos`` [N]),
    v [N, hk, d] (contiguous copy); one launch. ``inv_freq`` [d / 2] fp32 defaults to :func:`rope_inv_freq`.
    Gemma 3 (``gemma_ops``): ``one_plus`` (q_w, k_w hold ``1 + w`` in fp32; the norm rounds once, to y's dtype) and
    ``q_scale`` (q times it after RoPE, rounded)."""
    N = y.shape[0]
    assert y.dim() == 2 and y.shape[1] == (hq + 2 * hk) * d, (
        f"y must be [N, {(hq + 2 * hk) * d}] for hq={hq}, hk={hk}, d={d}; got {tuple(y.shape)}"
    )
    assert d % 2 == 0, f"head dim {d} must be even"
    assert (q_w is None) == (k_w is None), "q_w and k_w go together"
    if y.stride(1) != 1:
        y = y.contiguous()
    if pos.dim() != 1 or pos.stride(0) != 1:
        pos = pos.reshape(-1).contiguous()
    assert pos.shape[0] == N and not pos.is_floating_point(), (
        f"pos must be integer [{N}], got {pos.dtype} {tuple(pos.shape)}"
    )
    if inv_freq is None:
        inv_freq = rope_inv_freq(d, theta, y.device)
    assert inv_freq.shape[0] == d // 2 and inv_freq.dtype == torch.float32
    has_norm = q_w is not None
    qk_dtype = y.dtype
    if has_norm:
        assert (
            q_w.shape[0] == d and k_w.shape[0] == d and q_w.dtype == k_w.dtype and q_w.stride(0) == k_w.stride(0) == 1
        )
        if q_w.dtype != y.dtype and not one_plus:
            qk_dtype = torch.promote_types(y.dtype, q_w.dtype)
    q = torch.empty(N, hq, d, dtype=qk_dtype, device=y.device)
    k = torch.empty(N, hk, d, dtype=qk_dtype, device=y.device)
    v = torch.empty(N, hk, d, dtype=y.dtype, device=y.device)
    if N:
        BLOCK = next_pow2(d // 2)
        qk_norm_rope_kernel[(N, hq + 2 * hk)](
            y,
            pos,
            q_w if has_norm else y,
            k_w if has_norm else y,
            inv_freq,
            q,
            k,
            v,
            y.stride(0),
            hq,
            hk,
            float(eps),
            HALF=d // 2,
            BLOCK=BLOCK,
            HAS_NORM=has_norm,
            RNE=_RNE,
            ONE_PLUS=bool(one_plus),
            Q_SCALE=float(q_scale),
            num_warps=1,
            enable_fp_fusion=False,
        )
    return q, k, v


def rope_ref(x, pos, theta):
    """Rotate-half RoPE (same expression as ``oasis_exec.model.decoder.rope``). x: [..., T, H, D]; pos: int [..., T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[..., None] * inv
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def qk_norm_rope_ref(y, pos, hq, hk, d, q_w=None, k_w=None, eps=1e-6, theta=10000.0):
    q = y[:, : hq * d].view(-1, hq, d)
    k = y[:, hq * d : (hq + hk) * d].view(-1, hk, d)
    v = y[:, (hq + hk) * d :].view(-1, hk, d)
    if q_w is not None:
        q = rms_norm_ref(q, q_w, eps)
        k = rms_norm_ref(k, k_w, eps)
    return rope_ref(q, pos, theta), rope_ref(k, pos, theta), v.contiguous()


# ------------------------------------------------------------------------------------------------------- SwiGLU


@triton.jit
def act_mul_kernel(
    GU,
    OUT,
    stride_g,
    stride_o,
    M,
    BLOCK: tl.constexpr,
    RNE: tl.constexpr,
    GELU: tl.constexpr = False,
    K: tl.constexpr = 0.0,
):
    """``act(g) * u`` for a gated MLP: SiLU (Llama), or GELU's tanh form (Gemma, ``K`` = sqrt(2 / pi))."""
    n = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < M
    g = tl.load(GU + n * stride_g + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + n * stride_g + M + offs, mask=m, other=0.0).to(tl.float32)
    if GELU:
        z = tl.minimum(K * (g + 0.044715 * (g * g * g)), 15.0)  # tanh(15) is 1 in fp32; exp(2z) stays finite
        t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)  # tanh(z)
        a = 0.5 * g * (1.0 + t)  # torch's expression (as measured on the GPU at 0555870)
    else:
        a = g / (1.0 + tl.exp(-g))
    a = _cast(a, OUT.dtype.element_ty, RNE).to(tl.float32)  # F.silu / F.gelu round to the dtype
    tl.store(OUT + n * stride_o + offs, _cast(a * u, OUT.dtype.element_ty, RNE), mask=m)


def act_mul(gu, gelu_k=None):
    """gu [N, 2 m] (gate, then up) -> ``act(g) * u`` [N, m] in gu.dtype; one launch. ``gelu_k`` None: SiLU; else
    GELU's tanh form with that constant (``gemma_ops.gelu_mul``)."""
    assert gu.dim() == 2 and gu.shape[1] % 2 == 0, f"gu must be [N, 2 m], got {tuple(gu.shape)}"
    if gu.stride(1) != 1:
        gu = gu.contiguous()
    N, M = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(N, M, dtype=gu.dtype, device=gu.device)
    if N and M:
        BLOCK = min(1024, next_pow2(M))
        act_mul_kernel[(N, cdiv(M, BLOCK))](
            gu, out, gu.stride(0), out.stride(0), M, BLOCK=BLOCK, RNE=_RNE, GELU=gelu_k is not None,
            K=float(gelu_k or 0.0), num_warps=4 if BLOCK >= 512 else 1,
        )  # fmt: skip
    return out


def silu_mul(gu):
    """gu [N, 2 m] (gate, then up) -> ``F.silu(g) * u`` [N, m] in gu.dtype; one launch."""
    return act_mul(gu)


def silu_mul_ref(gu):
    g, u = gu.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u


# ------------------------------------------------------------------------------------------------------- bench


def bench_fused_ops(batch=8, hidden=4096, hq=32, hk=8, d=128, mlp=12288, seed=0):
    """Time of each fused op at a decode shape (bf16; GB/s of bytes read + written; these are latency-bound)."""
    from triton.testing import do_bench

    torch.manual_seed(seed)
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(batch, hidden, device=dev, dtype=dt)
    r = torch.randn_like(x)
    w = torch.randn(hidden, device=dev, dtype=dt)
    y = torch.randn(batch, (hq + 2 * hk) * d, device=dev, dtype=dt)
    qw, kw = torch.randn(d, device=dev, dtype=dt), torch.randn(d, device=dev, dtype=dt)
    pos = torch.randint(0, 32768, (batch,), device=dev)
    gu = torch.randn(batch, 2 * mlp, device=dev, dtype=dt)
    cases = [
        ("rms_norm", lambda: rms_norm(x, w, 1e-6), 2 * x.numel() * 2 + hidden * 2),
        ("add_rms_norm", lambda: add_rms_norm(x, r, w, 1e-6), 4 * x.numel() * 2 + hidden * 2),
        ("qk_norm_rope", lambda: qk_norm_rope(y, pos, hq, hk, d, qw, kw, 1e-6, 1e6), 2 * y.numel() * 2),
        ("silu_mul", lambda: silu_mul(gu), gu.numel() * 2 * 3 // 2),
    ]
    out = []
    for name, fn, nbytes in cases:
        ms = do_bench(fn, warmup=25, rep=200)
        gbps = nbytes / ms / 1e6
        out.append(
            dict(
                kernel=name,
                batch=batch,
                ms=ms,
                bytes=nbytes,
                gbps=gbps,
                roofline_gbps=HBM_ROOFLINE_GBPS,
                frac_roofline=gbps / HBM_ROOFLINE_GBPS,
                note="launch-bound at decode sizes: what matters is the absolute time",
            )
        )
    return out
