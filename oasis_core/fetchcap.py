"""Fetch-cap policies: how many missing blocks each row may fetch per step (the ``C`` of paper Algorithm 2).

A policy has two faces:

- ``max_cap(top_k) -> int``: a static bound, known before serving starts. Backends size their per-step transfer
  buffers with it (``StepPlan.fetch_block`` is ``[R, max_cap]``), so it must never depend on runtime data.
- ``cap(ctx) -> int or array[R]``: the cap of this step, from a ``CapContext``. Returning an int caps every row
  alike; an array caps each row (request, layer, KV head) separately. Values must lie in ``[0, max_cap(top_k)]``
  (``selection.plan_step`` clips to that range). An array result must be computed with array-namespace operations
  (``oasis_core.xp``) from the context's arrays, never through ``.item()``, ``.tolist()``, ``.cpu()`` or a Python
  branch on array values: on the executor the context arrays live on the GPU and the step must not synchronise.

Adaptive policies (drift-aware, link-rate-aware, byte budgets from paper eq. 3) subclass ``FetchCapPolicy`` and
read whatever they need from the context; callers never change.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional

DEFAULT_FETCH_RATIO = 0.05  # paper default: 0.05 of K, about 6 blocks per head per step at K = 128


@dataclass(frozen=True)
class CapContext:
    """What a policy may look at when it picks this step's cap.

    step: decode step index (0 = first decode step after admission).
    top_k: K, selectable blocks per row.
    rows: R, rows of (request, layer, KV head) planned this step.
    drift_so_far: array [R] of cumulative missing blocks per row up to the previous step, or None when the caller
        does not track it.
    n_missing: array [R] of missing blocks per row this step (``|P \\ R|``), or None when unknown yet.
    bytes_moved_total: bytes fetched into the GPU so far (all rows, all steps).
    last_step_time_s: wall (or simulated) time of the previous step in seconds, None before the first.
    link_bytes_per_s: bandwidth of the link the blocks cross, bytes per second, None when unknown.
    bytes_per_block_head: bytes of one block of one KV head (K and V), None when unknown.
    """

    step: int
    top_k: int
    rows: int
    drift_so_far: Optional[Any] = None
    n_missing: Optional[Any] = None
    bytes_moved_total: float = 0.0
    last_step_time_s: Optional[float] = None
    link_bytes_per_s: Optional[float] = None
    bytes_per_block_head: Optional[int] = None

    def __post_init__(self):
        if self.step < 0:
            raise ValueError(f"CapContext.step: must be >= 0, got {self.step}")
        if self.top_k < 0:
            raise ValueError(f"CapContext.top_k: must be >= 0, got {self.top_k}")
        if self.rows < 0:
            raise ValueError(f"CapContext.rows: must be >= 0, got {self.rows}")


class FetchCapPolicy(ABC):
    """Base of every fetch-cap policy (see the module docstring for the contract)."""

    @abstractmethod
    def max_cap(self, top_k: int) -> int:
        """Static upper bound of ``cap`` for this K; sizes the per-step transfer buffers."""

    @abstractmethod
    def cap(self, ctx: CapContext):
        """This step's cap: an int for all rows or an integer array [ctx.rows], each in ``[0, max_cap]``."""

    @property
    @abstractmethod
    def spec(self) -> str:
        """The string ``get_policy`` parses back into this policy (recorded with results)."""

    def __str__(self) -> str:
        return self.spec


def ratio_cap(ratio: float, top_k: int) -> int:
    """``ratio * top_k`` rounded half up, at least 1 when ``ratio > 0`` (a positive ratio always lets blocks in).

    Paper default: ``ratio_cap(0.05, 128) == 6`` (6.4 rounds to 6, the paper's "about 6 blocks").
    """
    if ratio <= 0 or top_k <= 0:
        return 0
    # The small epsilon makes products such as 0.35 * 10 = 3.4999999999999996 round as the decimal 3.5 does.
    return max(1, min(top_k, math.floor(ratio * top_k + 0.5 + 1e-9)))


@dataclass(frozen=True)
class Fixed(FetchCapPolicy):
    """The same cap every step and row: ``ratio_cap(ratio, K)`` blocks (paper default ratio 0.05)."""

    ratio: float = DEFAULT_FETCH_RATIO

    def __post_init__(self):
        if not (isinstance(self.ratio, (int, float)) and 0.0 <= self.ratio <= 1.0):
            raise ValueError(f"Fixed.ratio: must be a number in [0, 1], got {self.ratio!r}")

    def max_cap(self, top_k: int) -> int:
        return ratio_cap(self.ratio, top_k)

    def cap(self, ctx: CapContext) -> int:
        return ratio_cap(self.ratio, ctx.top_k)

    @property
    def spec(self) -> str:
        return f"fixed:{self.ratio:g}"


@dataclass(frozen=True)
class Unlimited(FetchCapPolicy):
    """No cap: every missing block is fetched (up to K, the most a row can miss)."""

    def max_cap(self, top_k: int) -> int:
        return max(0, top_k)

    def cap(self, ctx: CapContext) -> int:
        return max(0, ctx.top_k)

    @property
    def spec(self) -> str:
        return "unlimited"


POLICY_NAMES = ("fixed", "unlimited")


def get_policy(spec: str) -> FetchCapPolicy:
    """Parse a CLI spec: ``"fixed"`` (ratio 0.05), ``"fixed:0.1"``, ``"unlimited"``. Case and spaces ignored."""
    if not isinstance(spec, str):
        raise ValueError(f"fetch cap: expected a string such as 'fixed:0.05', got {spec!r}")
    name, sep, arg = spec.strip().lower().partition(":")
    name, arg = name.strip(), arg.strip()
    if name == "fixed":
        if not sep:
            return Fixed()
        try:
            ratio = float(arg)
        except ValueError:
            raise ValueError(f"fetch cap {spec!r}: ratio must be a number in [0, 1], got {arg!r}") from None
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"fetch cap {spec!r}: ratio must be a number in [0, 1], got {arg!r}")
        return Fixed(ratio)
    if name == "unlimited":
        if sep:
            raise ValueError(f"fetch cap {spec!r}: 'unlimited' takes no argument")
        return Unlimited()
    raise ValueError(f"fetch cap {spec!r}: unknown policy {name!r}; choices: fixed[:RATIO], unlimited")
