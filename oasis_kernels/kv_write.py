"""The decode step's KV write: each (request, KV head)'s new key and value into its block, one launch for both.

``kv_write(k_new, v_new, k_cache, v_cache, row, off)``:

- ``k_new, v_new: [B, Hkv, D]`` the step's keys/values (last dim contiguous; other dims may be strided, e.g.
  ``k[:, 0]`` of a ``[B, nq, Hkv, D]`` tensor);
- ``k_cache, v_cache: [n_rows, block_size, D]`` any cache viewed as rows of one block of one head: the dense pages
  ``[pages, Hkv, bs, D].view(-1, bs, D)`` (row = page * Hkv + head) or the sparse slot pool ``[slots, bs, D]``
  (row = the local block's slot);
- ``row: [B * Hkv]`` int32 destination row of (b, h) (-1 = skip), ``off: [B]`` int32 token offset in the block.

It replaces two advanced-indexing assignments (``cache[row, off] = new``), which cost several small kernels each
(index arithmetic, ``index_put``): on the H200 about 0.43 ms of a 10.2 ms dense step at batch 8 (36 layers).
``kv_write_ref`` is that plain-torch assignment with the -1 skip (the tests' reference; ``oasis_exec.runner.ops`` keeps a
mask-free copy of it for CPU runs, where every row is live and a boolean mask would force a host sync on CUDA).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._util import check, next_pow2


@triton.jit
def kv_write_kernel(
    KN, VN, KC, VC, ROW, OFF, n_heads, s_knb, s_knh, s_vnb, s_vnh, s_kcr, s_kct, s_vcr, s_vct, D: tl.constexpr
):
    i = tl.program_id(0)  # (b, h) = (i // n_heads, i % n_heads)
    b = i // n_heads
    h = i % n_heads
    row = tl.load(ROW + i)
    live = row >= 0
    off = tl.load(OFF + b).to(tl.int64)
    r64 = tl.where(live, row, 0).to(tl.int64)
    d = tl.arange(0, D)
    m = live & (d < D)
    k = tl.load(KN + b.to(tl.int64) * s_knb + h * s_knh + d, mask=m)
    v = tl.load(VN + b.to(tl.int64) * s_vnb + h * s_vnh + d, mask=m)
    tl.store(KC + r64 * s_kcr + off * s_kct + d, k, mask=m)
    tl.store(VC + r64 * s_vcr + off * s_vct + d, v, mask=m)


def kv_write(k_new, v_new, k_cache, v_cache, row, off):
    """Write ``k_new[b, h]`` / ``v_new[b, h]`` into ``cache[row[b * Hkv + h], off[b]]``; see the module docstring."""
    B, H, D = k_new.shape
    dev = k_new.device
    assert D == next_pow2(D), f"head dim {D} must be a power of two"
    check(k_new, "k_new", (B, H, D), None, dev)
    check(v_new, "v_new", (B, H, D), k_new.dtype, dev)
    n_rows, bs, _ = k_cache.shape
    check(k_cache, "k_cache", (n_rows, bs, D), k_new.dtype, dev)
    check(v_cache, "v_cache", (v_cache.shape[0], bs, D), k_new.dtype, dev)
    check(row, "row", (B * H,), torch.int32, dev)
    check(off, "off", (B,), torch.int32, dev)
    if B * H == 0:
        return
    kv_write_kernel[(B * H,)](
        k_new,
        v_new,
        k_cache,
        v_cache,
        row,
        off,
        H,
        k_new.stride(0),
        k_new.stride(1),
        v_new.stride(0),
        v_new.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        D=D,
        num_warps=1,
    )


def kv_write_ref(k_new, v_new, k_cache, v_cache, row, off):
    """Plain torch, in place: the advanced-indexing assignment the kernel replaces (rows < 0 skipped)."""
    B, H, D = k_new.shape
    r = row.long().view(B, H)
    o = off.long()[:, None].expand(B, H)
    live = r >= 0
    k_cache[r[live], o[live]] = k_new[live]
    v_cache[r[live], o[live]] = v_new[live]
