"""Named ``SyntheticParams`` sets: ``paper`` (the defaults, calibrated to the paper's Qwen3-8B figures),
``smollm2`` (fitted to real attention of SmolLM2-135M-Instruct by ``oasis_core.synthetic_fit``) and ``gemma3`` (Gemma
3 270M's full layers at 16K and 32K with a correct draft, fitted to the victim-cache savings at K = 64, 128, 256 by
``experiments/long_context_draft/fit_returns.py``; it uses the generator's returns and K-dependent drift).

Select one with ``{"preset": "smollm2"}`` in ``ExecConfig.synthetic`` / ``SimConfig.synthetic`` (other keys of the
mapping override its fields) or ``--syn-preset smollm2`` in ``python -m oasis_sim run``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping, Optional

from .echo import show
from .synthetic import SyntheticParams

SMOLLM2 = SyntheticParams(
    drift_rate=0.2334,
    drift_zone=0.5549,
    hot_fraction=0.25,
    window_fraction=0.1667,
    head_share=0.5815,
    draft_error_rate=0.1896,
    draft_layer_spread=0.1771,
    proxy_error_rate=0.0,
    novelty_rate=0.4303,
)
"""SmolLM2-135M-Instruct (Q4_1 GGUF) with its trained EAGLE-3 head (``experiments/trained_draft_head/smollm2-eagle3``), fitted
by ``synthetic_fit.fit_params`` to the CPU measurement (fp32, 2026-12-01, commit ec734bc,
``experiments/draft_predicts_next_blocks/results/selection_cpu_eagle3.json``; ``experiments/draft_predicts_next_blocks/README.md``): the five
evaluation texts at N = 4,096 tokens (2,224-4,096 used), block 16, K = 12.5% of the blocks (17-32), 64 decode
positions each, averaged over texts; the head's sparse (engine-view) agreement 81.0%, worst layer 72.1%. The lead
refits from the H200 run (bf16, 4K and 8K: ``fit`` in that JSON). Against the paper's preset: adjacent overlap 75.8%
(88%), proxy 76.0% (83.9%; ``proxy_error_rate`` 0: the proxy is as good as the step-to-step overlap), KV-head
overlap 54% (0.89 share), 0.43 never-seen blocks per row per step after the first 32 steps, entering blocks at mean
rank 0.71 of K (the drift zone is the lower 55% of the ranks, not 25%), a near-miss window of 17% of the outsiders.
``novelty_rate`` is in blocks per row per step at K = 17-32; applied at K = 128 it is a smaller fraction of K."""
GEMMA3 = SyntheticParams(
    drift_rate=0.2803,
    drift_share_exponent=0.2866,
    drift_zone=0.6144,
    hot_fraction=0.25,
    window_fraction=0.4677,
    head_share=1.0,
    draft_error_rate=0.0,
    draft_layer_spread=0.0,
    proxy_error_rate=0.0,
    novelty_rate=0.0,
    return_rate=0.7073,
    return_depth=0.651,
)
"""Gemma 3 270M (Q4_K_M GGUF, fp32 on the CPU), its three full-attention layers (5, 11, 17; one KV head each), block
16, the **correct draft token in the dense view** (the prediction is the true next top-K: ``draft_error_rate`` 0),
fitted to the quantity the victim cache lives on -- blocks fetched a row a step at S = K, 2K, 3K slots (policy
``unlimited``, second half of the steps) -- at K = 64, 128 and 256 blocks of three real runs: the Debian licences at
32,768 tokens (2,048 blocks, 16 consecutive positions at the end) and 16,384 (1,024 blocks, 32 positions), and
held-out window 0 of the draft corpus at 16,384 (issue 37, 2026-12-05; the real top-K sets are committed,
``experiments/long_context_draft/data/gemma_topk_sets*.npz``; the fit is ``fit_returns.py``, the comparison
``gemma_slots.py``, ``results/gemma_slots_*_cpu.json``). One set for every K, both lengths and both texts: each of
the 18 savings (S = 2K, 3K; real 53-92%) within 10% of the real one (worst 9%), the fetch at S = K (real 21-76
blocks) within 11%. On runs not fitted it holds less: held-out window 1 at 16K 5 of 6 savings within 10%, the four
held-out windows at 32K 17 of 24 (6, 3, 4, 4; worst 19.5%: 62.6 vs 77.8% at K = 256, S = 2K), every miss the preset
saving less (window 0's first 16K tokens are a fitted run). The texts' churn differs (late blocks entering a step at
32K: 22-42% of K over five texts) and the real savings at S = 2K rise as it falls, so a single preset, fitted at the
high-churn end, misses the calmer texts (``results/gemma_set_churn_32k_cpu.txt``). What real attention needed: a
churn that is a fraction of K falling with the share of the context K covers (38% of K a step at 3% of the blocks,
22% at 25%: ``drift_rate`` 0.28 at 1/8, ``drift_share_exponent`` 0.29), and returns (more than half of the incoming
blocks were evicted a few steps earlier: ``return_rate`` 0.71 of the incomers drawn at a recency depth of about 0.65
K, the rest from a near-miss window of 47% of the outsiders, where never-selected blocks come from: ``novelty_rate``
0). Replaces the first fit (same day, K = 256 at 32K only: ``novelty_rate`` 14 blocks, no returns), which missed at
K = 64 and 128 (8-46% against 55-71%).
Short runs (16-32 steps from an empty victim cache) understate a long decode's savings; both sides share that
warm-up."""
PRESETS = {"paper": SyntheticParams(), "smollm2": SMOLLM2, "gemma3": GEMMA3}


def resolve(overrides: Optional[Mapping[str, Any]]) -> SyntheticParams:
    """The parameters of ``overrides``: its ``preset`` (default ``paper``) with its other keys as field overrides.
    ValueError names an unknown preset or field."""
    over = dict(overrides or {})
    name = over.pop("preset", "paper")
    if name not in PRESETS:
        raise ValueError(f"unknown preset {show(name)}; choose from {', '.join(sorted(PRESETS))}")
    names = {f.name for f in fields(SyntheticParams)}
    for k in over:
        if k not in names:
            raise ValueError(f"unknown field {show(k)}; choose from {', '.join(sorted(names | {'preset'}))}")
    base = {f.name: getattr(PRESETS[name], f.name) for f in fields(SyntheticParams)}
    base.update(over)
    return SyntheticParams(**base)
