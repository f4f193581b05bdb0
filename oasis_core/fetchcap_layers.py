"""``PerLayer``: the bytes ``Fixed(ratio)`` may move per step, shared out over the layers by their measured drift.

Each layer keeps one state column (``CapContext.layer_state``): the moving average of its rows' mean missing blocks.
When a layer plans::

    ema[l]  = ema[l] + alpha · (mean_r n_missing_r - ema[l])          (the layers being planned)
    w       = floor(64 · ema) + 1                                     (integer weights; every layer keeps a share)
    share   = largest-remainder split of ratio_cap(ratio, K) · layers over the layers in proportion to w
    cap     = split_budget(n_missing of layer l's rows, min(share[l], max_cap) · rows of l, max_cap, min_cap)

So the step's budget, ``ratio_cap(ratio, K)`` block-heads per row on average (what ``Fixed(ratio)`` moves at most),
goes where the drift is: a layer whose draft misses more gets a larger share, and within a layer the share is split
over the rows by need. Rows come either one layer per call (``CapContext.layer``, the executor: each layer's share
is taken when it plans, from every layer's latest average, so a step's shares sum to the budget up to that
one-step lag) or all layers at once, layer-major (``layer=None``, the simulator's ``policy_layers`` sampled
layers, each standing for ``layers / policy_layers`` of the model's). Integer arithmetic after the float64 average:
numpy and torch agree and torch never synchronises. Spec: ``per-layer[:RATIO][,alpha=A][,min_cap=N][,max_ratio=R]``.
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
    split_budget,
)
from .xp import namespace

WEIGHT_SCALE = 64  # fixed-point steps per missing block in the layer weights
_NO_BOUND = 1 << 40  # split_budget's per-entry bound when the weights must not be clamped


@dataclass(frozen=True)
class PerLayer(FetchCapPolicy):
    """Per-layer shares of a fixed per-step budget by measured drift (see the module docstring).

    ratio: the budget, ``ratio_cap(ratio, K)`` block-heads per row on average, (0, 1].
    alpha: weight of the newest step in each layer's moving average, (0, 1].
    min_cap: per-row floor in blocks (>= 0); 0 keeps the budget a hard bound.
    max_ratio: ``max_cap`` as a fraction of K, (0, 1]; a layer's per-row share is clipped to it.
    """

    ratio: float = DEFAULT_FETCH_RATIO
    alpha: float = 0.3
    min_cap: int = 0
    max_ratio: float = 0.25

    def __post_init__(self):
        for name in ("ratio", "alpha", "max_ratio"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
                raise ValueError(f"PerLayer.{name}: must be a number in (0, 1], got {show(v)}")
        if isinstance(self.min_cap, bool) or not isinstance(self.min_cap, int) or self.min_cap < 0:
            raise ValueError(f"PerLayer.min_cap: must be an integer >= 0, got {show(self.min_cap)}")

    def max_cap(self, top_k: int) -> int:
        return ratio_cap(self.max_ratio, top_k)

    def layer_state_init(self, top_k: int) -> tuple:
        return (0.0,)  # moving average of the layer's mean missing blocks per row

    def shares(self, ema, top_k: int, layers: int):
        """Per-row blocks of each layer [layers] (int64): ``ratio_cap(ratio, K) · layers`` split by weight."""
        xp = namespace(ema)
        w = xp.astype(ema * float(WEIGHT_SCALE), xp.int64) + 1  # truncation of a value >= 0 is its floor
        total = ratio_cap(self.ratio, top_k) * layers
        # Weights scaled by the budget always out-demand it, so split_budget splits it exactly by weight.
        s = split_budget(w * total, total, _NO_BOUND)
        return xp.minimum(s, xp.full((), self.max_cap(top_k), xp.int64, like=s))

    def cap(self, ctx: CapContext):
        if ctx.layer_state is None or ctx.n_missing is None:
            raise ValueError("PerLayer.cap: needs CapContext.layer_state and n_missing, got None")
        st = ctx.layer_state
        xp = namespace(st)
        f = st.dtype
        c = self.max_cap(ctx.top_k)
        n = xp.astype(ctx.n_missing, xp.int64)
        if ctx.layer is not None:  # one layer's rows
            sl = slice(ctx.layer, ctx.layer + 1)
            mean = xp.sum(xp.astype(n, f)) / float(max(ctx.rows, 1))
            assign(st[sl, 0], st[sl, 0] + self.alpha * (mean - st[sl, 0]))
            share = self.shares(st[:, 0], ctx.top_k, ctx.layers)[sl]
            return split_budget(n, share[0] * ctx.rows, c, self.min_cap)
        if ctx.rows % ctx.layers:
            raise ValueError(f"PerLayer.cap: rows must be a multiple of layers={ctx.layers}, got {ctx.rows}")
        per = ctx.rows // ctx.layers
        n2 = n.reshape(ctx.layers, per)
        mean = xp.sum(xp.astype(n2, f), axis=1) / float(max(per, 1))
        assign(st[:, 0], st[:, 0] + self.alpha * (mean - st[:, 0]))
        share = self.shares(st[:, 0], ctx.top_k, ctx.layers)
        parts = [split_budget(n2[i], share[i] * per, c, self.min_cap) for i in range(ctx.layers)]
        return xp.concat(parts, axis=0) if parts else n

    @property
    def spec(self) -> str:
        return spec_of(self, "per-layer", positional="ratio")


register_policy(
    "per-layer",
    "per-layer[:RATIO][,alpha=A][,min_cap=N][,max_ratio=R]",
    lambda spec, arg: parse_fields(
        spec, arg, PerLayer, {"ratio": float, "alpha": float, "min_cap": int, "max_ratio": float}, "ratio"
    ),
)
