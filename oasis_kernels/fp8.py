"""fp8 (e4m3) host copies: the Triton helpers that quantize a (block, head) unit and dequantize it again.

The host pool may hold K and V as float8_e4m3fn with one float32 scale per (layer, block, KV head) of K and of V
(``ExecConfig.host_kv_dtype="fp8_e4m3"``, ``oasis_exec.kv.host_quant`` is the plain-torch reference). A unit of
``bs * D`` values ``x`` is stored as ``q = e4m3(clamp(x * (448 / amax), -448, 448))`` and ``scale = amax / 448``
(``amax = max |x|`` over the unit; ``amax == 0``: scale 1, q 0); it reads back as ``q * scale`` in the compute dtype.

The conversions are written in integer arithmetic rather than with ``.to(tl.float8e4nv)`` / ``.to(tl.bfloat16)``
because Triton's CPU interpreter gets both wrong (its fp32 -> fp8 rounding drops the mantissa carry, its fp32 ->
bf16 cast truncates): the helpers below round to nearest even exactly as the hardware and torch do, so one kernel
source gives the bytes of the torch reference bit for bit under ``TRITON_INTERPRET=1`` and on the GPU
(``tests/unit/test_host_fp8.py``). The divisions are ``div_rn`` (Triton's plain ``/`` on fp32 is approximate on
the GPU). The pool's fp8 tensors reach the kernels as ``uint8`` views (the codes); ``e4m3_bits`` /
``e4m3_value`` convert between codes and float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


@triton.jit
def e4m3_bits(y):
    """float32 ``y`` with ``|y| <= 448`` -> its float8_e4m3fn code (int32 0..255), round to nearest even."""
    b = y.to(tl.int32, bitcast=True)
    neg = b < 0
    a = b & 0x7FFFFFFF
    E = a >> 23  # biased fp32 exponent
    # normal e4m3 (|y| >= 2^-6: E >= 121): keep 3 mantissa bits, nearest even; a carry moves into the exponent
    r = a + 0x7FFFF + ((a >> 20) & 1)
    normal = (r >> 20) - 960  # (E - 127 + 7) << 3 | mantissa
    # subnormal (|y| < 2^-6): the code is rne(|y| * 2^9) = rne(mant24 >> (141 - E)); rounds up to 8 = 2^-6 at the top
    s = tl.minimum(141 - E, 31)
    mant = (a & 0x7FFFFF) | 0x800000
    half = tl.full(s.shape, 1, tl.int32) << (s - 1)
    sub = (mant + (half - 1) + ((mant >> s) & 1)) >> s
    code = tl.where(E >= 121, normal, sub)
    return tl.where(neg, code | 0x80, code)


@triton.jit
def e4m3_value(c):
    """float8_e4m3fn code ``c`` (int32 0..255, never a NaN code) -> its float32 value."""
    e = (c >> 3) & 15
    m = c & 7
    nv = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sv = m.to(tl.float32) * 0.001953125  # subnormal: m * 2^-9
    v = tl.where(e == 0, sv, nv)
    return tl.where((c & 0x80) != 0, -v, v)


@triton.jit
def bf16_rne(x):
    """float32 -> bfloat16, round to nearest even (finite values)."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def quantize_unit(x):
    """One unit's float32 values ``x`` (any shape) -> (codes int32, scale float32 scalar)."""
    amax = tl.max(tl.abs(x))
    pos = amax > 0
    scale = tl.where(pos, tl.math.div_rn(amax, 448.0), 1.0)
    inv = tl.where(pos, tl.math.div_rn(448.0, tl.where(pos, amax, 1.0)), 1.0)
    y = tl.minimum(tl.maximum(x * inv, -448.0), 448.0)
    return e4m3_bits(y), scale


@triton.jit
def dequant(c, scale, OUT_BF16: tl.constexpr):
    """Codes ``c`` (int32) times ``scale`` (broadcast) in the slots' dtype: bfloat16 (``OUT_BF16``) or float32.
    One return: Triton compiles every return statement of a function, the ones after a taken constexpr branch too,
    and refuses two of different types (the interpreter does not; the H200 did, 2026-12-01)."""
    v = e4m3_value(c) * scale
    if OUT_BF16:
        v = bf16_rne(v)
    return v
