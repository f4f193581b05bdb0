"""``DriftAdaptive``: a per-row cap that follows the row's recent miss rate, with hysteresis.

Each row keeps two state columns (``CapContext.row_state``): the exponential moving average of the share of its
predicted set that is missing, ``miss = n_missing / max(n_predicted, 1)`` (``/ K`` without ``n_predicted``), and its current cap. Every step::

    ema = ema + alpha · (miss - ema)
    cap = min(max(2 · cap, cap + 1), max_cap)   if ema > high   (a context shift: grow fast)
          max(cap - 1, min_cap)                 if ema < low    (a stable working set: shrink slowly)
          cap                                   otherwise       (the dead band between the thresholds)

The two thresholds are the hysteresis: a row that grew keeps its cap until its miss rate falls below ``low``, not
merely below ``high``. Float64 element-wise operations in one order and integer clipping: numpy and torch give the
same caps, and torch never synchronises. Spec: ``drift[:low=L][,high=H][,alpha=A][,ratio=R][,min_ratio=R]
[,max_ratio=R]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .echo import show
from .fetchcap_base import (
    DEFAULT_FETCH_RATIO,
    CapContext,
    FetchCapPolicy,
    assign,
    parse_fields,
    ratio_cap,
    register_policy,
    spec_of,
)
from .xp import namespace


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


@dataclass(frozen=True)
class DriftAdaptive(FetchCapPolicy):
    """Per-row cap from the row's recent miss rate (see the module docstring).

    low, high: thresholds on the moving average of the missing share, ``0 <= low < high <= 1``.
    alpha: weight of the newest step in the moving average, (0, 1].
    ratio: the cap every row starts with, ``ratio_cap(ratio, K)``, [0, 1].
    min_ratio, max_ratio: the cap stays in ``[ratio_cap(min_ratio, K), ratio_cap(max_ratio, K)]``;
        ``max_ratio`` in (0, 1] sizes the executor's transfer buffers.
    """

    low: float = 0.05
    high: float = 0.15
    alpha: float = 0.3
    ratio: float = DEFAULT_FETCH_RATIO
    min_ratio: float = 0.02
    max_ratio: float = 0.25

    def __post_init__(self):
        for name in ("low", "high", "alpha", "ratio", "min_ratio", "max_ratio"):
            v = getattr(self, name)
            if not (_real(v) and 0 <= v <= 1):
                raise ValueError(f"DriftAdaptive.{name}: must be a number in [0, 1], got {show(v)}")
        if not self.low < self.high:
            raise ValueError(f"DriftAdaptive.low: must be below high={self.high:g}, got {show(self.low)}")
        if self.alpha == 0:
            raise ValueError(f"DriftAdaptive.alpha: must be > 0, got {show(self.alpha)}")
        if self.max_ratio == 0 or self.min_ratio > self.max_ratio:
            raise ValueError(
                f"DriftAdaptive.max_ratio: must be > 0 and >= min_ratio={self.min_ratio:g}, got {show(self.max_ratio)}"
            )

    def max_cap(self, top_k: int) -> int:
        return ratio_cap(self.max_ratio, top_k)

    def _bounds(self, top_k: int) -> tuple[int, int, int]:
        hi = self.max_cap(top_k)
        lo = min(ratio_cap(self.min_ratio, top_k), hi)
        return lo, min(max(ratio_cap(self.ratio, top_k), lo), hi), hi

    def row_state_init(self, top_k: int) -> tuple:
        return (0.0, float(self._bounds(top_k)[1]))  # (moving average of the missing share, cap)

    def cap(self, ctx: CapContext):
        if ctx.row_state is None or ctx.n_missing is None:
            raise ValueError("DriftAdaptive.cap: needs CapContext.row_state and n_missing, got None")
        lo, _, hi = self._bounds(ctx.top_k)
        st = ctx.row_state
        xp = namespace(st)
        f = st.dtype
        n = xp.astype(ctx.n_missing, f)
        if ctx.n_predicted is None:  # a host-side branch on a field: the share of K instead
            p = xp.full((), float(max(ctx.top_k, 1)), f, like=st)
        else:
            p = xp.maximum(xp.astype(ctx.n_predicted, f), xp.full((), 1.0, f, like=st))
        miss = n / p
        ema = st[:, 0] + self.alpha * (miss - st[:, 0])
        cur = st[:, 1]
        up = xp.minimum(xp.maximum(2.0 * cur, cur + 1.0), xp.full((), float(hi), f, like=st))
        down = xp.maximum(cur - 1.0, xp.full((), float(lo), f, like=st))
        new = xp.where(ema > self.high, up, xp.where(ema < self.low, down, cur))
        assign(st[:, 0], ema)
        assign(st[:, 1], new)
        return xp.astype(new, xp.int64)

    @property
    def spec(self) -> str:
        return spec_of(self, "drift")


_FIELDS = {k: float for k in ("low", "high", "alpha", "ratio", "min_ratio", "max_ratio")}
register_policy(
    "drift",
    "drift[:low=L][,high=H][,alpha=A][,ratio=R][,min_ratio=R][,max_ratio=R]",
    lambda spec, arg: parse_fields(spec, arg, DriftAdaptive, _FIELDS),
)
