"""The fp8 (e4m3) host copy of K and V: plain-torch quantize / dequantize, the reference of the Triton kernels.

``ExecConfig.host_kv_dtype``: ``"auto"`` keeps the host pool in the compute dtype (bf16 on the GPU); ``"fp8_e4m3"``
stores K and V as ``torch.float8_e4m3fn`` with one float32 scale per (layer, block, KV head) of K and one of V --
the unit a fetch moves -- so a fetch moves ``bs * D`` bytes of K and of V (plus 4 bytes each) instead of
``2 * bs * D``, and the pool takes half the host memory (a quarter of a float32 pool).

Design (issue 17): *dequantize in the copy*. Whatever reads the host copy turns it back into the compute dtype on
its way into the GPU slots -- the UVA gather kernel (``oasis_kernels.gather.uva_gather``: reads fp8 codes and the scale,
writes bf16), the host-staged path (fp8 rows and their scales staged and DMA'd, the scatter kernel dequantizes) and
the inline path (``HostPool.read``: this module) -- so the GPU slots, the summaries and the attention kernel are
unchanged and the GPU working set stays bf16. The other design, fp8 slots dequantized inside
``oasis_kernels.sparse_attn``, would also halve the GPU working set (twice the lanes in a budget) and the attention's
HBM reads, at the cost of a second attention kernel variant and fp8 summaries or local blocks; not built.

Quantization (``quantize``) happens wherever host copies are written: a prefill's host copies
(``ModelExec.prefill``), the write-back of filled local blocks (``oasis_exec.transfer.writeback``, a Triton kernel on CUDA)
and the short-context crossing's offload (the same kernel). Per unit ``x`` (``bs * D`` values)::

    amax  = max |x|                           (float32)
    scale = amax / 448,  inv = 448 / amax     (1 and 1 when amax == 0)
    q     = float8_e4m3fn(clamp(x * inv, -448, 448))      round to nearest even
    x'    = (float32(q) * scale).to(compute dtype)

so ``|x - x'| <= amax / 28`` plus the compute dtype's own rounding of ``x'``: e4m3 keeps 3 mantissa bits, and half an
ulp of its top binade [256, 448] is 16 = 448 / 28 (relative to each value: at most 2^-4; values below
``amax * 2^-6 / 448``, e4m3's subnormals, keep less).
A block resident on the GPU always holds ``x'``: the first working set after a prefill and a crossing's blocks are
rounded through the same quantization, so every non-local slot equals the dequantized host copy of its block.
"""

from __future__ import annotations

import torch

from oasis_core.geometry import HOST_KV_DTYPES  # noqa: F401  -- the choices, named here too

E4M3_MAX = 448.0
SCALE_DTYPE = torch.float32


def fp8_dtype():
    """``torch.float8_e4m3fn``; RuntimeError naming the torch version when this torch has no such dtype."""
    dt = getattr(torch, "float8_e4m3fn", None)
    if dt is None:
        raise RuntimeError(f"host_kv_dtype=fp8_e4m3 needs torch.float8_e4m3fn; torch {torch.__version__} has none")
    return dt


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [..., bs, D] (any float dtype, any device) -> (codes float8_e4m3fn [..., bs, D], scales float32 [...]),
    one scale per unit (the last two dims)."""
    x32 = x.float()
    amax = x32.abs().amax(dim=(-2, -1))
    pos = amax > 0
    one = torch.ones_like(amax)
    cap = torch.full_like(amax, E4M3_MAX)
    # tensor / tensor: one correctly rounded division, as the kernels' div_rn. torch computes ``448 / t`` as
    # ``t.reciprocal() * 448`` (two roundings) and a CUDA ``t / 448`` as ``t * (1 / 448)``: either puts a tie such as
    # 200 = 225 / 504 * 448 one float32 ulp off, and the code one step off (seen on the H200, 2026-12-02).
    scale = torch.where(pos, amax / cap, one)
    inv = torch.where(pos, cap / torch.where(pos, amax, one), one)
    q = (x32 * inv[..., None, None]).clamp(-E4M3_MAX, E4M3_MAX).to(fp8_dtype())
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Codes ``q`` [..., bs, D] and scales [...] -> values in ``dtype`` (on ``q``'s device)."""
    return (q.float() * scale.to(q.device, torch.float32)[..., None, None]).to(dtype)


def roundtrip(x: torch.Tensor) -> torch.Tensor:
    """``dequantize(quantize(x))`` in ``x``'s dtype: what a block reads back from an fp8 host copy."""
    q, s = quantize(x)
    return dequantize(q, s, x.dtype)


def error_bound(x: torch.Tensor) -> torch.Tensor:
    """The most ``|x - roundtrip(x)|`` may be per unit of ``x`` [..., bs, D] in float32 arithmetic: half an e4m3 ulp
    at the unit's top binade, ``amax / 28`` (16 of 448), with a float32 rounding's slack (tests add the compute
    dtype's rounding of the result)."""
    return x.float().abs().amax(dim=(-2, -1)) * (16.0 / E4M3_MAX) * (1 + 2.0**-20)
