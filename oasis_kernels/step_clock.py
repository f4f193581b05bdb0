"""The GPU's nanosecond clock (PTX ``%globaltimer``) stamped into a device tensor by a one-program launch.

``stamp(ns, end=False)`` writes the clock into ``ns[0]``; ``stamp(ns, end=True)`` writes the time since ``ns[0]``
into ``ns[1]``. Both run in stream order on the current stream, never synchronise the host and can be captured in
a CUDA graph (each replay reads the clock anew). CUDA only: the interpreter cannot run inline PTX, so
``stamp_host`` is the CPU's equivalent from ``time.perf_counter_ns`` (same slots, same meaning).
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

from ._util import check


@triton.jit
def step_clock_kernel(NS, END: tl.constexpr):
    now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    if END:
        tl.store(NS + 1, now - tl.load(NS))
    else:
        tl.store(NS, now)


def stamp(ns: torch.Tensor, end: bool = False) -> None:
    """ns: int64 [>= 2] on a CUDA device; start (``end=False``) or end of the timed span."""
    check(ns, "ns", (ns.shape[0],), torch.int64)
    assert ns.is_cuda and ns.shape[0] >= 2, "ns: an int64 CUDA tensor of at least 2 elements"
    step_clock_kernel[(1,)](ns, END=end, num_warps=1)


def stamp_host(ns: torch.Tensor, end: bool = False) -> None:
    """``stamp`` on the CPU: the host's monotonic clock, in nanoseconds."""
    now = time.perf_counter_ns()
    if end:
        ns[1] = now - int(ns[0])
    else:
        ns[0] = now
