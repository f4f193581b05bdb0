"""ChurnCap: each row's cap follows its churn (missing blocks per step), smoothed, with headroom, floor and ceiling.

    ema = ema + alpha * (n_missing - ema)                      # row state, one column
    cap = clip(round(gain * ema), ratio_cap(min_ratio, K), ratio_cap(max_ratio, K))

Spec: churn[:GAIN][,alpha=A][,min_ratio=R][,max_ratio=R]. Load: OASIS_POLICY_MODULES=docs/examples/churn_cap.py
"""

from dataclasses import dataclass

from oasis_core.fetchcap import FetchCapPolicy, assign, parse_fields, ratio_cap, register_policy, spec_of
from oasis_core.xp import namespace


@dataclass(frozen=True)
class ChurnCap(FetchCapPolicy):
    gain: float = 1.5  # headroom over the smoothed churn, so that a backlog drains
    alpha: float = 0.3  # weight of the newest step in the moving average
    min_ratio: float = 0.02  # floor, a fraction of K
    max_ratio: float = 0.25  # ceiling, a fraction of K; it sizes the executor's transfer buffers

    def __post_init__(self):
        if not (0 < self.gain < float("inf") and 0 < self.alpha <= 1 and 0 <= self.min_ratio <= self.max_ratio <= 1):
            raise ValueError(
                f"ChurnCap: needs 0 < gain < inf, 0 < alpha <= 1, 0 <= min_ratio <= max_ratio <= 1: {self}"
            )

    def max_cap(self, top_k):
        return ratio_cap(self.max_ratio, top_k)

    def row_state_init(self, top_k):
        return (0.0,)  # the moving average of the row's missing blocks

    def cap(self, ctx):
        if ctx.row_state is None or ctx.n_missing is None:  # a host-side check of the context, not of data
            raise ValueError("ChurnCap: needs row_state and n_missing (simulator: --policy-sampling exact)")
        st = ctx.row_state
        xp = namespace(st)
        ema = st[:, 0] + self.alpha * (xp.astype(ctx.n_missing, st.dtype) - st[:, 0])
        assign(st[:, 0], ema)  # in place: the backend carries the state to the next step
        want = xp.astype(self.gain * ema + 0.5, xp.int64)  # round half up (ema >= 0: truncation is floor)
        lo = xp.full((), ratio_cap(self.min_ratio, ctx.top_k), xp.int64, like=want)
        return xp.minimum(xp.maximum(want, lo), xp.full((), self.max_cap(ctx.top_k), xp.int64, like=want))

    @property
    def spec(self):
        return spec_of(self, "churn", positional="gain")


FIELDS = {"gain": float, "alpha": float, "min_ratio": float, "max_ratio": float}
register_policy(
    "churn",
    "churn[:GAIN][,alpha=A][,min_ratio=R][,max_ratio=R]",
    lambda spec, arg: parse_fields(spec, arg, ChurnCap, FIELDS, "gain"),
)
