"""Fit ``SyntheticParams`` to selection statistics measured on a real model (numpy only).

``MeasuredSelection`` holds the statistics the quality harness (``python -m oasis_exec quality selection``)
measures and that the generator can reproduce; ``generator_stats`` measures the same quantities on the generator
with the same definitions (the first four are ``synthetic.measure``'s, pooled over rows and steps); ``fit_params``
searches the parameters until the generator's statistics match:

| statistic | definition | parameter that moves it |
| --- | --- | --- |
| ``agreement`` | draft prediction vs the true next top-K, ``Σ|D ∩ T_{t+1}| / Σ|T_{t+1}|`` | ``draft_error_rate`` |
| ``min_layer_agreement`` | the same, worst layer | ``draft_layer_spread`` |
| ``proxy_recall`` | current-query proxy vs ``T_{t+1}`` | ``proxy_error_rate`` |
| ``adjacent_overlap`` | ``|T_t ∩ T_{t+1}| / K`` | ``drift_rate`` |
| ``head_overlap`` | ``T_{t+1}`` of two KV heads of a layer, mean over pairs | ``head_share`` |
| ``new_late`` | blocks per row per step in ``T`` no earlier measured step held (2nd half) | ``novelty_rate`` |
| ``new_per_step`` | the same over all steps: the excess is the window being explored | ``window_fraction`` |
| ``entering_rank`` | mean ``(rank + 0.5) / K`` in ``T_{t+1}`` of its blocks not in ``T_t`` | ``drift_zone`` |

(``hot_fraction`` follows the zone: ``min(0.25, 1 - drift_zone)``. The window never shrinks below what the drift,
draft and proxy replacements need: each draws distinct window blocks, and too small a window caps the churn.)
The search starts from the closed-form expectations (module docstring of ``synthetic``) and then corrects each
parameter by its statistic's residual for a few rounds (each statistic depends mostly on its own parameter).

``traffic`` reports what a parameter set implies for the link: fetched and missing blocks per row per step under
paper Algorithm 2 (``synthetic.capped_recall``) at a model's shape, in bytes per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .synthetic import SyntheticParams, SyntheticSelection, capped_recall, set_hits

STATS = (
    "agreement",
    "min_layer_agreement",
    "proxy_recall",
    "adjacent_overlap",
    "head_overlap",
    "new_per_step",
    "new_late",
    "entering_rank",
)


@dataclass(frozen=True)
class MeasuredSelection:
    """Selection statistics of one geometry (``k`` of ``n_blocks`` blocks, ``layers`` x ``kv_heads`` rows per
    request, ``steps`` consecutive decode steps); fractions in [0, 1], ``new_per_step`` in blocks."""

    agreement: float
    min_layer_agreement: float
    proxy_recall: float
    adjacent_overlap: float
    head_overlap: float
    new_per_step: float
    new_late: float
    entering_rank: float
    k: int
    n_blocks: int
    layers: int
    kv_heads: int
    steps: int

    @classmethod
    def from_harness(cls, avg: dict, draft: str, *, layers: int, kv_heads: int, steps: int) -> "MeasuredSelection":
        """From one entry of the quality harness's ``average`` (means over texts) and the draft whose sparse
        (engine-view) agreement is the target."""
        m, d = avg["mean"], avg["drafts"][draft]["sparse"]
        return cls(
            agreement=d["mean"],
            min_layer_agreement=d["min_layer"],
            proxy_recall=m["proxy"],
            adjacent_overlap=m["adjacent"],
            head_overlap=m["heads"],
            new_per_step=m["new"],
            new_late=m.get("new_late", m["new"]),
            entering_rank=m["entering_rank"],
            k=int(round(avg["k"])),
            n_blocks=int(round(avg["n_blocks"])),
            layers=layers,
            kv_heads=kv_heads,
            steps=steps,
        )


def generator_stats(
    params: SyntheticParams,
    k: int,
    n_blocks: int,
    layers: int,
    kv_heads: int,
    steps: int,
    requests: int = 4,
    seed: int = 0,
) -> MeasuredSelection:
    """The ``MeasuredSelection`` statistics of the generator (numpy), pooled over ``requests`` requests."""
    rows = requests * layers * kv_heads
    sel = SyntheticSelection(rows, n_blocks, k, params, seed, layers=layers, kv_heads=kv_heads)
    w = sel.width
    n_true = n_draft = n_proxy = n_adj = 0
    layer_true = np.zeros(layers)
    layer_draft = np.zeros(layers)
    head_hits = head_n = 0.0
    fresh = np.zeros(steps)
    rank_sum = rank_n = 0.0
    seen = np.zeros((rows, w + 1), bool)
    prev = sel.current()
    seen[np.arange(rows)[:, None], np.where(prev >= 0, prev, w)] = True
    frac = (np.arange(k) + 0.5) / k
    layer = np.asarray(sel.layer_of_row)
    pairs = [(i, j) for i in range(kv_heads) for j in range(i + 1, kv_heads)]
    for step in range(steps):
        s = sel.step()
        t = s.true_next
        valid = t >= 0
        nt = valid.sum(-1)
        nd = set_hits(s.draft, t, w)
        n_true += nt.sum()
        n_draft += nd.sum()
        n_proxy += set_hits(s.proxy, t, w).sum()
        n_adj += set_hits(prev, t, w).sum()
        layer_true += np.bincount(layer, weights=nt, minlength=layers)
        layer_draft += np.bincount(layer, weights=nd, minlength=layers)
        g = t.reshape(-1, kv_heads, t.shape[-1])
        for i, j in pairs:
            head_hits += set_hits(g[:, i], g[:, j], w).sum()
            head_n += (g[:, j] >= 0).sum()
        ids = np.where(valid, t, w)
        fresh[step] = (~np.take_along_axis(seen, ids, -1) & valid).sum() / rows
        seen[np.arange(rows)[:, None], ids] = True
        entering = ~(t[:, :, None] == prev[:, None, :]).any(-1) & valid
        rank_sum += (entering * frac).sum()
        rank_n += entering.sum()
        prev = t
    per_layer = layer_draft / np.maximum(layer_true, 1)
    return MeasuredSelection(
        agreement=float(n_draft / max(n_true, 1)),
        min_layer_agreement=float(per_layer.min()),
        proxy_recall=float(n_proxy / max(n_true, 1)),
        adjacent_overlap=float(n_adj / max(n_true, 1)),
        head_overlap=float(head_hits / head_n) if pairs else 1.0,
        new_per_step=float(fresh.mean()),
        new_late=float(fresh[steps // 2 :].mean()),
        entering_rank=float(rank_sum / max(rank_n, 1)),
        k=k,
        n_blocks=n_blocks,
        layers=layers,
        kv_heads=kv_heads,
        steps=steps,
    )


def _clip(x, lo, hi):
    return float(min(max(x, lo), hi))


def _window_floor(p: dict, m: MeasuredSelection) -> float:
    """The smallest ``window_fraction`` whose window holds the distinct blocks the drift + proxy errors, or the
    worst layer's draft errors, draw in one step (mean + 3 sd + 1)."""
    outside = max(m.n_blocks - 1 - m.k, 1)

    def need(rate):
        mean = rate * m.k
        return mean + 3 * np.sqrt(max(mean, 0.0)) + 1

    worst_draft = p["draft_error_rate"] + p["draft_layer_spread"] / 2
    return min(1.0, max(need(p["drift_rate"] + p["proxy_error_rate"]), need(worst_draft)) / outside)


def _valid(p: dict, m: MeasuredSelection) -> SyntheticParams:
    """Clip a parameter dict into the generator's valid region (``SyntheticParams.__post_init__``) and the window
    above its floor."""
    p = dict(p)
    p["drift_zone"] = _clip(p["drift_zone"], 0.02, 1.0)
    p["hot_fraction"] = _clip(min(0.25, 1.0 - p["drift_zone"]), 0.0, 0.99)
    p["drift_rate"] = _clip(p["drift_rate"], 0.0, min(1.0 - p["hot_fraction"], p["drift_zone"]))
    p["draft_error_rate"] = _clip(p["draft_error_rate"], 0.0, 1.0)
    e = p["draft_error_rate"]
    p["draft_layer_spread"] = _clip(p["draft_layer_spread"], 0.0, 2 * min(e, 1.0 - e))
    p["proxy_error_rate"] = _clip(p["proxy_error_rate"], 0.0, 1.0)
    p["head_share"] = _clip(p["head_share"], 0.0, 1.0)
    p["novelty_rate"] = _clip(p["novelty_rate"], 0.0, 1e9)
    p["window_fraction"] = _clip(p["window_fraction"], _window_floor(p, m), 1.0)
    return SyntheticParams(**p)


def initial_guess(m: MeasuredSelection, base: Optional[SyntheticParams] = None) -> SyntheticParams:
    """Closed-form starting point from the generator's expectations."""
    base = base or SyntheticParams()
    err = 1.0 - m.agreement
    novelty = max(m.new_late, 0.0)
    drift = 1.0 - m.adjacent_overlap - novelty / max(m.k, 1)
    p = dict(vars(base))
    p.update(
        draft_error_rate=err,
        draft_layer_spread=2 * (m.agreement - m.min_layer_agreement),
        drift_rate=drift,
        proxy_error_rate=1.0 - m.proxy_recall / max(m.adjacent_overlap, 1e-9),
        head_share=m.head_overlap,
        novelty_rate=novelty,
        drift_zone=max(2 * (1.0 - m.entering_rank), drift + 0.01),
    )
    return _valid(p, m)


def fit_params(
    m: MeasuredSelection, rounds: int = 10, requests: int = 4, seed: int = 0, base: Optional[SyntheticParams] = None
) -> tuple[SyntheticParams, MeasuredSelection]:
    """Parameters whose ``generator_stats`` (at ``m``'s geometry) match ``m``; returns (params, achieved stats):
    the best of ``rounds`` corrections by the summed absolute residual (block counts divided by K).

    Fields the table in the module docstring does not name keep ``base``'s values (default: the paper's)."""
    p = initial_guess(m, base)
    best, best_err, best_stats = p, float("inf"), None
    for _ in range(rounds):
        g = generator_stats(p, m.k, m.n_blocks, m.layers, m.kv_heads, m.steps, requests, seed)
        err = sum(abs(getattr(g, s) - getattr(m, s)) / (max(m.k, 1) if s.startswith("new") else 1.0) for s in STATS)
        if err < best_err:
            best, best_err, best_stats = p, err, g
        q = dict(vars(p))
        q["draft_error_rate"] += g.agreement - m.agreement
        q["draft_layer_spread"] += 2 * ((m.agreement - m.min_layer_agreement) - (g.agreement - g.min_layer_agreement))
        q["drift_rate"] += g.adjacent_overlap - m.adjacent_overlap
        q["proxy_error_rate"] += (g.proxy_recall - m.proxy_recall) / max(m.adjacent_overlap, 1e-9)
        q["head_share"] += m.head_overlap - g.head_overlap
        q["novelty_rate"] += m.new_late - g.new_late
        q["drift_zone"] += 2 * (g.entering_rank - m.entering_rank)
        ex_m, ex_g = m.new_per_step - m.new_late, g.new_per_step - g.new_late
        q["window_fraction"] *= float(np.clip(ex_m / ex_g, 0.5, 2.0)) if ex_g > 1e-3 else (2.0 if ex_m > ex_g else 1.0)
        p = _valid(q, m)
    return best, best_stats


@dataclass(frozen=True)
class Traffic:
    """Per decode step, under paper Algorithm 2 on the draft's predictions (``synthetic.capped_recall``)."""

    fetch_ratio: Optional[float]  # None = unlimited
    fetch_blocks_per_row: float
    missing_blocks_per_row: float
    recall: float  # of the true top-K held by the resident set
    bytes_per_request: float  # fetched bytes per request per step (all layers and KV heads)
    gb_per_step_batch: float  # the same for ``batch`` requests, GB (1e9 B)
    batch: int


def traffic(
    params: SyntheticParams,
    *,
    layers: int = 36,
    kv_heads: int = 8,
    head_dim: int = 128,
    dtype_bytes: int = 2,
    block_size: int = 16,
    context_tokens: int = 16384,
    top_k: int = 128,
    fetch_ratio: Optional[float] = 0.05,
    batch: int = 128,
    requests: int = 2,
    steps: int = 64,
    warmup: int = 20,
    seed: int = 0,
) -> Traffic:
    """Blocks fetched per row per step and the bytes that implies (defaults: Qwen3-8B at 16K, K = 128, the paper's
    batch 128 assumption; a (block, head, layer) of K+V is ``block_size * 2 * head_dim * dtype_bytes`` bytes)."""
    from .fetchcap import Fixed, Unlimited

    rows = requests * layers * kv_heads
    n_blocks = -(-context_tokens // block_size)
    sel = SyntheticSelection(rows, n_blocks, top_k, params, seed, layers=layers, kv_heads=kv_heads)
    cap = Unlimited() if fetch_ratio is None else Fixed(fetch_ratio)
    r = capped_recall(sel, steps, cap, warmup)
    per_block = block_size * 2 * head_dim * dtype_bytes
    per_request = r.fetch_per_row * layers * kv_heads * per_block
    return Traffic(
        fetch_ratio=fetch_ratio,
        fetch_blocks_per_row=r.fetch_per_row,
        missing_blocks_per_row=r.missing_per_row,
        recall=r.recall,
        bytes_per_request=per_request,
        gb_per_step_batch=per_request * batch / 1e9,
        batch=batch,
    )
