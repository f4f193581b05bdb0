"""``RecallTarget``: the smallest cap that keeps a target recall of the predicted set.

After the plan a row holds ``n_predicted - n_missing + min(cap, n_missing)`` of its predicted blocks (given enough
victims), so its recall of the predicted set (resident ∩ predicted / predicted) is at least ``target`` exactly when
the row leaves at most ``allowed = floor((1 - target) · n_predicted)`` predicted blocks missing::

    cap = clip(n_missing - allowed, 0, max_cap)

``target`` is held in millionths, so ``allowed`` is integer arithmetic: numpy and torch agree and torch never
synchronises. Stateless. Spec: ``recall[:TARGET][,max_ratio=R]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .echo import show
from .fetchcap_base import CapContext, FetchCapPolicy, parse_fields, ratio_cap, register_policy, spec_of
from .xp import namespace

_MILLION = 1_000_000


@dataclass(frozen=True)
class RecallTarget(FetchCapPolicy):
    """Per-row cap keeping ``target`` of the predicted set resident (see the module docstring).

    target: recall of the predicted set to keep, [0, 1], resolved to millionths.
    max_ratio: ``max_cap`` as a fraction of K, (0, 1]: where the target would need more, the row falls short.
    """

    target: float = 0.95
    max_ratio: float = 0.25

    def __post_init__(self):
        if not (isinstance(self.target, (int, float)) and not isinstance(self.target, bool) and 0 <= self.target <= 1):
            raise ValueError(f"RecallTarget.target: must be a number in [0, 1], got {show(self.target)}")
        if not (isinstance(self.max_ratio, (int, float)) and not isinstance(self.max_ratio, bool)):
            raise ValueError(f"RecallTarget.max_ratio: must be a number in (0, 1], got {show(self.max_ratio)}")
        if not 0 < self.max_ratio <= 1:
            raise ValueError(f"RecallTarget.max_ratio: must be a number in (0, 1], got {show(self.max_ratio)}")

    def max_cap(self, top_k: int) -> int:
        return ratio_cap(self.max_ratio, top_k)

    def cap(self, ctx: CapContext):
        if ctx.n_missing is None:
            raise ValueError("RecallTarget.cap: needs CapContext.n_missing, got None")
        xp = namespace(ctx.n_missing)
        n = xp.astype(ctx.n_missing, xp.int64)
        if ctx.n_predicted is None:  # host-side branch on a field: every row predicts K blocks
            p = xp.full(n.shape, ctx.top_k, xp.int64, like=n)
        else:
            p = xp.astype(ctx.n_predicted, xp.int64)
        keep = round(self.target * _MILLION)
        allowed = p * (_MILLION - keep) // _MILLION
        zero = xp.full((), 0, xp.int64, like=n)
        return xp.minimum(xp.maximum(n - allowed, zero), xp.full((), self.max_cap(ctx.top_k), xp.int64, like=n))

    @property
    def spec(self) -> str:
        return spec_of(self, "recall", positional="target")


register_policy(
    "recall",
    "recall[:TARGET][,max_ratio=R]",
    lambda spec, arg: parse_fields(spec, arg, RecallTarget, {"target": float, "max_ratio": float}, "target"),
)
