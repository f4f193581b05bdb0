"""Write local blocks that just filled back to the pinned host pool, decided on the device (no host sync).

Items are (row, local slot) pairs: item i copies GPU slot ``src[i]`` (K and V, ``bs * D`` elements each) into host
unit ``dst[i]`` (``host_block * H + head`` of one layer) when ``n_valid[i] == block_size``. On CUDA a small Triton
kernel writes host memory through its unified virtual address (one program per item; rows whose block is not full
return at once), so the decode step, CUDA-graph captured or not, needs no host knowledge of which blocks filled.
"""

from __future__ import annotations

import kernels  # noqa: F401  -- decides TRITON_INTERPRET before triton is first imported (see kernels/__init__.py)

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU installs without triton use the torch path
    triton = None

if triton is not None:

    @triton.jit
    def _writeback_kernel(SK, SV, HK, HV, SRC, DST, NV, FULL: tl.constexpr, BSD: tl.constexpr):
        i = tl.program_id(0)
        if tl.load(NV + i) == FULL:
            s = tl.load(SRC + i).to(tl.int64)
            d = tl.load(DST + i).to(tl.int64)
            offs = tl.arange(0, BSD)
            tl.store(HK + d * BSD + offs, tl.load(SK + s * BSD + offs))
            tl.store(HV + d * BSD + offs, tl.load(SV + s * BSD + offs))


def writeback_full(k_slots, v_slots, host_k, host_v, src, dst, n_valid, block_size: int) -> None:
    """k_slots/v_slots: [n_slots, bs, D] (GPU or CPU); host_k/host_v: [n_host_blocks, H, bs, D] of one layer
    (pinned when the slots are on the GPU); src, dst, n_valid: [M] int tensors on the slots' device."""
    if k_slots.device.type == "cuda":
        from kernels.gather import UVAPointer

        n = src.shape[0]
        bsd = k_slots.shape[1] * k_slots.shape[2]
        assert k_slots.is_contiguous() and host_k.is_contiguous() and host_v.is_contiguous()
        _writeback_kernel[(n,)](
            k_slots,
            v_slots,
            UVAPointer(host_k),
            UVAPointer(host_v),
            src,
            dst,
            n_valid,
            FULL=block_size,
            BSD=bsd,
            num_warps=4,
        )
        return
    full = n_valid == block_size
    if not bool(full.any()):
        return
    s, d = src[full].long(), dst[full].long()
    nb, H, bs, D = host_k.shape
    host_k.view(nb * H, bs, D)[d] = k_slots[s]
    host_v.view(nb * H, bs, D)[d] = v_slots[s]
