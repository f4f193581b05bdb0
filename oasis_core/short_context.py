"""Short contexts: a sparse-mode request whose whole KV fits its resident set runs dense on the GPU.

A sparse mode keeps ``top_k + local_blocks`` blocks per (layer, KV head) on the GPU (``KVGeometry.resident_bytes``).
While a request's context covers at most that many blocks, its top-K would select every block anyway: copying the
KV to the host, predicting and transferring buy nothing. Such a request is **resident-dense**:

- it attends all its tokens in place (dense attention; no summary scoring, top-K, draft token or transfer);
- its KV exists only on the GPU: no host copy, no host bytes, no first fill after its prefill;
- it holds dense GPU memory (its tokens' KV, whole blocks), never more than the resident set.

At the **crossing**, the first step whose context no longer fits (``window_tokens < ctx``), the request turns
sparse: the KV it holds so far (``ctx - 1`` tokens, everything written before this step) is copied to the host
once, and from then on it holds the sparse mode's GPU state and ``ctx`` tokens of host KV, as a request that was
long from the start. Its first sparse step selects among blocks that are all still on the GPU.

Every function takes a context length in tokens -- a Python int, a numpy array or a torch tensor of them (one
element per request or lane) -- and returns the same kind, built from operators only (no ``.item()``, no Python
branch on values), so a per-lane torch version on the device is the same call. ``ctx`` is the number of tokens whose
KV the step attends, the newest included (``prompt + generated`` in a decode step; the prefill target at a prefill).

What the executor must do with it (per lane, each step, before planning): lanes with ``dense(ctx)`` run the dense
attention path on their GPU blocks and skip scoring, selection, drafting and fetches, and the runner allocates no
host blocks for them; lanes with ``crossing(ctx)`` copy ``offload_tokens(ctx)`` tokens of KV device->host (their
host blocks are taken then, ``host_tokens(ctx)`` from then on) and compute their block summaries before their first
selection, which must finish before any of their blocks is evicted from the resident set.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from .echo import show


@dataclass(frozen=True, kw_only=True)
class ShortContext:
    """The short-context rule for one sparsity setting: ``top_k`` selected blocks plus ``local_blocks`` newest ones
    per KV head, ``block_size`` tokens per block."""

    top_k: int
    block_size: int
    local_blocks: int = 1

    def __post_init__(self):
        for name, lo in (("top_k", 0), ("block_size", 1), ("local_blocks", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
                raise ValueError(f"ShortContext.{name}: must be an integer >= {lo}, got {show(v)}")
        if self.top_k + self.local_blocks < 1:
            raise ValueError(
                f"ShortContext.top_k: top_k + local_blocks must be >= 1, got {show(self.top_k)} + {show(self.local_blocks)}"
            )

    @property
    def window_tokens(self) -> int:
        """Most tokens a resident-dense request holds: ``(top_k + local_blocks) * block_size``."""
        return (self.top_k + self.local_blocks) * self.block_size

    def dense(self, ctx):
        """True where a step over ``ctx`` tokens runs resident-dense (its whole KV fits the resident set)."""
        return ctx <= self.window_tokens

    def crossing(self, ctx):
        """True where the step over ``ctx`` tokens is the first one that does not fit: the offload step."""
        w = self.window_tokens
        return (ctx > w) & (ctx - 1 <= w)

    def offload_tokens(self, ctx):
        """Tokens of KV copied device->host in the step over ``ctx`` tokens: ``ctx - 1`` at the crossing, else 0."""
        return (ctx - 1) * self.crossing(ctx)

    def host_tokens(self, ctx):
        """Tokens whose KV the host holds once ``ctx`` tokens are written: 0 while resident-dense, else ``ctx``."""
        return ctx * (ctx > self.window_tokens)
