"""The opening lines several kernels share, as ``@triton.jit`` helpers. Triton inlines a jitted helper into each
kernel that calls it, so a kernel compiles as if the lines were its own (checked when this module was made: the
sm_90 PTX of every signature the CPU kernel tests launch was identical before and after, debug lines aside)."""

import triton
import triton.language as tl


@triton.jit
def score_program(SEAT, NBLK, HKV: tl.constexpr, HAS_SEAT: tl.constexpr, EXCLUDE_LOCAL: tl.constexpr):
    """A block-scoring program over (request, KV head) x a tile of blocks: the tile ``nb``, the request ``b``, the
    head ``h``, the seat of the request's summaries and its eligible blocks (the local block left out when
    ``EXCLUDE_LOCAL``)."""
    row = tl.program_id(0)
    nb = tl.program_id(1)
    b = row // HKV
    h = row % HKV
    seat = b
    if HAS_SEAT:
        seat = tl.load(SEAT + b)
    n_blk = tl.load(NBLK + b)
    n_ok = n_blk - 1 if EXCLUDE_LOCAL else n_blk
    return nb, b, h, seat, n_ok


@triton.jit
def summary_item(K, SRC, DROW, DBLK, NVALID, stride_ks, stride_kt, BS: tl.constexpr, D: tl.constexpr):
    """A summary item (one program each): its destination row and block, its valid token count, whether it is live
    (a source and a token), the mask of its valid tokens and its source block's keys [BS, D] in fp32 (zeros where
    masked)."""
    i = tl.program_id(0)
    src = tl.load(SRC + i)
    n_valid = tl.load(NVALID + i)
    row = tl.load(DROW + i)
    blk = tl.load(DBLK + i)
    live = (src >= 0) & (n_valid > 0)
    offs_t = tl.arange(0, BS)
    offs_d = tl.arange(0, D)
    ok = live & (offs_t < n_valid)
    k = tl.load(
        K + tl.where(live, src, 0).to(tl.int64) * stride_ks + offs_t[:, None] * stride_kt + offs_d[None, :],
        mask=ok[:, None],
        other=0.0,
    ).to(tl.float32)
    return row, blk, n_valid, live, ok, k
