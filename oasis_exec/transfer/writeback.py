"""Write local blocks that just filled back to the pinned host pool, decided on the device (no host sync).

Items are (row, local slot) pairs: item i copies GPU slot ``src[i]`` (K and V, ``bs * D`` elements each) into host
unit ``dst[i]`` (``host_block * H + head`` of one layer) when ``n_valid[i] == block_size``. On CUDA a small Triton
kernel writes host memory through its unified virtual address (one program per item; rows whose block is not full
return at once), so the decode step, CUDA-graph captured or not, needs no host knowledge of which blocks filled.

An fp8 host copy (``HostPool.quantized``, ``host_kv_dtype="fp8_e4m3"``): the kernel quantizes each unit on its way
(``oasis_kernels.fp8.quantize_unit``: amax of the unit's K, and of its V, scale = amax / 448, codes e4m3, round to nearest
even; scale 1 when amax is 0) and writes the codes and the two scales; ``roundtrip`` also writes the dequantized
values back into the source slot (the short-context crossing's offload: its blocks stay resident, and a resident
block holds what its host copy reads back as). The CPU path is the plain-torch reference (``oasis_exec.kv.host_quant``),
which the kernel equals bit for bit (``tests/unit/test_host_fp8.py``).
"""

from __future__ import annotations

import oasis_kernels  # noqa: F401  -- decides TRITON_INTERPRET before triton is first imported (see oasis_kernels/__init__.py)

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs without triton use the torch path
    triton = None

if triton is not None:
    from oasis_kernels.fp8 import dequant, quantize_unit

    @triton.jit
    def _writeback_kernel(SK, SV, HK, HV, SRC, DST, NV, FULL: tl.constexpr, BSD: tl.constexpr):
        i = tl.program_id(0)
        if tl.load(NV + i) == FULL:
            s = tl.load(SRC + i).to(tl.int64)
            d = tl.load(DST + i).to(tl.int64)
            offs = tl.arange(0, BSD)
            tl.store(HK + d * BSD + offs, tl.load(SK + s * BSD + offs))
            tl.store(HV + d * BSD + offs, tl.load(SV + s * BSD + offs))

    @triton.jit
    def _quantize_one(SLOTS, CODES, SCALES, s, d, BSD: tl.constexpr, ROUNDTRIP: tl.constexpr, OUT_BF16: tl.constexpr):
        """Slot ``s``'s unit of K (or V) -> host unit ``d``'s codes and scale; with ``ROUNDTRIP`` the slot gets the
        dequantized values back."""
        offs = tl.arange(0, BSD)
        c, sc = quantize_unit(tl.load(SLOTS + s * BSD + offs).to(tl.float32))
        tl.store(CODES + d * BSD + offs, c.to(tl.uint8))
        tl.store(SCALES + d, sc)
        if ROUNDTRIP:
            tl.store(SLOTS + s * BSD + offs, dequant(c, sc, OUT_BF16))

    @triton.jit
    def _writeback_fp8_kernel(
        SK,
        SV,
        HK,
        HV,
        HKS,
        HVS,
        SRC,
        DST,
        NV,
        FULL: tl.constexpr,
        BSD: tl.constexpr,
        ROUNDTRIP: tl.constexpr,
        OUT_BF16: tl.constexpr,
    ):
        """HK/HV: the pool's codes (uint8 views), HKS/HVS: its scales [n_units] float32."""
        i = tl.program_id(0)
        if tl.load(NV + i) == FULL:
            s = tl.load(SRC + i).to(tl.int64)
            d = tl.load(DST + i).to(tl.int64)
            _quantize_one(SK, HK, HKS, s, d, BSD, ROUNDTRIP, OUT_BF16)
            _quantize_one(SV, HV, HVS, s, d, BSD, ROUNDTRIP, OUT_BF16)


def writeback_full(
    k_slots, v_slots, host_k, host_v, src, dst, n_valid, block_size: int, scales=None, roundtrip=False
) -> None:
    """k_slots/v_slots: [n_slots, bs, D] (GPU or CPU); host_k/host_v: [n_host_blocks, H, bs, D] of one layer
    (pinned when the slots are on the GPU); src, dst, n_valid: [M] int tensors on the slots' device. ``scales``:
    ``(k_scale, v_scale)`` [n_host_blocks, H] float32 of an fp8 pool (``host_k``/``host_v`` float8_e4m3fn), None for
    a pool in the slots' dtype; ``roundtrip`` (fp8 only): the slots get the dequantized values too. On CUDA the
    kernel (``writeback_kernel``), else the torch reference."""
    if k_slots.device.type == "cuda":
        writeback_kernel(k_slots, v_slots, host_k, host_v, src, dst, n_valid, block_size, scales, roundtrip)
        return
    full = n_valid == block_size
    if not bool(full.any()):
        return
    s, d = src[full].long(), dst[full].long()
    nb, H, bs, D = host_k.shape
    if scales is None:
        host_k.view(nb * H, bs, D)[d] = k_slots[s]
        host_v.view(nb * H, bs, D)[d] = v_slots[s]
        return
    from ..kv.host_quant import dequantize, quantize

    for slots, pool, sc in ((k_slots, host_k, scales[0]), (v_slots, host_v, scales[1])):
        q, scale = quantize(slots[s])
        pool.view(nb * H, bs, D)[d] = q
        sc.view(nb * H)[d] = scale
        if roundtrip:
            slots[s] = dequantize(q, scale, slots.dtype)


def writeback_kernel(
    k_slots, v_slots, host_k, host_v, src, dst, n_valid, block_size: int, scales=None, roundtrip=False
) -> None:
    """``writeback_full``'s Triton kernel, whatever the device (on CPU tensors it runs in Triton's interpreter:
    the tests compare it with the torch path)."""
    import torch

    from oasis_kernels.gather import _host_arg

    n = src.shape[0]
    bsd = k_slots.shape[1] * k_slots.shape[2]
    assert k_slots.is_contiguous() and host_k.is_contiguous() and host_v.is_contiguous()
    if n == 0:
        return
    if scales is None:
        _writeback_kernel[(n,)](
            k_slots,
            v_slots,
            _host_arg(host_k),
            _host_arg(host_v),
            src,
            dst,
            n_valid,
            FULL=block_size,
            BSD=bsd,
            num_warps=4,
        )
        return
    ks, vs = scales
    assert ks.is_contiguous() and vs.is_contiguous()
    _writeback_fp8_kernel[(n,)](
        k_slots,
        v_slots,
        _host_arg(host_k.view(torch.uint8)),
        _host_arg(host_v.view(torch.uint8)),
        _host_arg(ks),
        _host_arg(vs),
        src,
        dst,
        n_valid,
        FULL=block_size,
        BSD=bsd,
        ROUNDTRIP=bool(roundtrip),
        OUT_BF16=k_slots.dtype == torch.bfloat16,
        num_warps=4,
    )
