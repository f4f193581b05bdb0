"""Named ``SyntheticParams`` sets: ``paper`` (the defaults, calibrated to the paper's Qwen3-8B figures),
``smollm2`` (fitted to real attention of SmolLM2-135M-Instruct by ``oasis_core.synthetic_fit``) and ``gemma3`` (the
same, Gemma 3 270M's full layers at 32K with a correct draft).

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
    drift_rate=0.2429,
    drift_zone=0.6228,
    hot_fraction=0.25,
    window_fraction=0.1251,
    head_share=1.0,
    draft_error_rate=0.0,
    draft_layer_spread=0.0,
    proxy_error_rate=0.0,
    novelty_rate=14.07,
)
"""Gemma 3 270M (Q4_K_M GGUF, fp32 on the CPU), its three full-attention layers (5, 11, 17; one KV head each) at
32,768 tokens of the Debian licences, 16 consecutive positions at the end, block 16, K = 256 blocks (of 2,048), the
**correct draft token in the dense view** (the prediction is the true next top-K: ``draft_error_rate`` 0), fitted by
``synthetic_fit.fit_params`` (issue 37, 2026-12-05; ``experiments/long_context_draft/gemma_slots.py``,
``results/gemma_slots_32k_cpu.json``): adjacent overlap 72.3%, proxy 72.3%, 16.3 never-seen blocks a row a step in
the second half (``novelty_rate`` is in blocks at K = 256: far more churn than SmolLM2's 0.43 at K = 17-32), entering
rank 0.69. Its victim-cache savings (S = 2K, 3K vs S = K, fetches a row a step, second half) are within 10% of the real
ones at K = 256 only (66.0 / 76.2% real, see the JSON for K = 64 and 128, where it misses); 16 steps is a short
warm-up, so both understate a long decode's savings."""
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
