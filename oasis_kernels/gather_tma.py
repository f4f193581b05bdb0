"""Experimental: the direct-read gather with Hopper's tensor-memory accelerator (TMA) reading the pinned pool.

Same contract as ``oasis_kernels.gather.uva_gather`` (pool ``[nb, Hkv, block_size, D]`` pinned on the host, slots
``[n_slots, block_size, D]`` on the GPU, int32 copy list ``src_block, src_head, dst_slot``, -1 = skip), but each
program asks the TMA unit for a whole (block, head) tile instead of having its threads load it: few threads, and the
pipeliner keeps ``stages`` tiles in flight. The question it answers (``experiments/transfer_paths/uva_gather_variants.py --kernel``):
does a gather that barely occupies its SMs lose less of its rate beside the decode step's kernels than the
thread-load gather, which reaches ~50 GB/s alone but 35-43 GB/s in the step?

Each item is viewed as ``ROWS x COLS`` elements with 128-byte rows (the TMA box's inner extent; 16 x 128 bf16 ->
32 x 64). A skipped item loads tile 0 and stores nothing. Not used by the engine.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._util import check
from .gather import _check_pool_and_slots, _host_arg


@triton.jit
def tma_gather_kernel(
    HKD,
    HVD,
    SRC_BLK,
    SRC_HEAD,
    DST,
    KS,
    VS,
    n_items,
    H: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    NPROG: tl.constexpr,
    STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    for i in tl.range(pid, n_items, NPROG, num_stages=STAGES):
        blk = tl.load(SRC_BLK + i)
        hd = tl.load(SRC_HEAD + i)
        dst = tl.load(DST + i)
        live = (blk >= 0) & (dst >= 0)
        row = tl.where(live, (blk * H + hd) * ROWS, 0)
        k = HKD.load([row, 0])
        v = HVD.load([row, 0])
        base = tl.where(live, dst, 0).to(tl.int64) * (ROWS * COLS)
        m = live & (offs >= 0)
        tl.store(KS + base + offs, k, mask=m)
        tl.store(VS + base + offs, v, mask=m)


def _descriptor(pool: torch.Tensor, rows: int, cols: int):
    from triton.tools.tensor_descriptor import TensorDescriptor

    n = pool.numel() // cols
    return TensorDescriptor(_host_arg(pool), [n, cols], [cols, 1], [rows, cols])


def tma_gather(host_k, host_v, src_block, src_head, dst_slot, k_slots, v_slots, n_programs=16, stages=3, num_warps=1):
    """Copy ``src (block, head)`` of the pinned pool into ``dst_slot`` of the GPU slots through TMA loads."""
    nb, Hkv, BS, D = _check_pool_and_slots(host_k, host_v, k_slots, v_slots)
    if not (host_k.is_contiguous() and host_v.is_contiguous() and k_slots.is_contiguous() and v_slots.is_contiguous()):
        raise ValueError("tma_gather needs contiguous pools and slots")
    item_bytes = BS * D * host_k.element_size()
    cols = 128 // host_k.element_size()
    if item_bytes % 128:
        raise ValueError(f"a (block, head) item of {item_bytes} bytes is not a whole number of 128-byte rows")
    rows = item_bytes // 128
    C = src_block.shape[0]
    for name, t in (("src_block", src_block), ("src_head", src_head), ("dst_slot", dst_slot)):
        check(t, name, (C,), torch.int32, k_slots.device)
    if C == 0:
        return
    n_programs = max(1, min(n_programs, C))
    tma_gather_kernel[(n_programs,)](
        _descriptor(host_k, rows, cols),
        _descriptor(host_v, rows, cols),
        src_block,
        src_head,
        dst_slot,
        k_slots,
        v_slots,
        C,
        H=Hkv,
        ROWS=rows,
        COLS=cols,
        NPROG=n_programs,
        STAGES=stages,
        num_warps=num_warps,
    )
