"""Block scorers: what a block's summary holds and how a query ranks blocks by it (``--block-score``).

Every scorer summarises a block of ``block_size`` keys, per KV head, into two vectors ``(a, b)`` of the head dim D, so
all of them fit the storage the min/max summaries always had (the executor's ``kmin`` / ``kmax`` tensors, the
simulator's summary bytes): 2 D values per block, 1/16 of the block's K + V bytes at block 16. A scorer ranks the
blocks of a KV head for the ``G`` query heads that share it (query head ``h * G + g`` reads KV head ``h``, HF
``repeat_kv`` order):

- ``minmax`` (Quest's, the paper's; the default until issue 38): ``a, b`` = coordinate-wise min and max of the keys; per query head the upper
  bound ``relu(q) . b + min(q, 0) . a`` of ``max_t q . k_t``; the KV head's score is the **max** over its query heads.
- ``minmax_sum``: the same summaries and bound, **summed** over the query heads (a block that several heads of the
  group want beats one that a single head wants a little more).
- ``mean``: ``a`` = the mean key of the block (``b`` = ``a``: written, never read; the scorer needs 1/32 of the
  block's K + V); score ``sum_g q_g . mean``, the group's summed query against the block's centroid, which ranks by
  typical rather than extreme alignment.
- ``gauss``: ``a`` = mean key, ``b`` = per-channel standard deviation of the block's keys (population, over its
  valid tokens). Treating a block's keys as independent per channel with that mean and spread, the expected
  unnormalised attention of a token is ``E exp(c q . k) = exp(c q . mean + c^2 / 2 sum_i q_i^2 var_i)``, ``c`` the
  softmax scale; its log is the score per query head (an estimate of the block's log-mass, not a bound), and the KV
  head's score is the **log-sum-exp** over its query heads (their summed mass, each head's normaliser taken equal).

Any scorer takes the suffix ``+sink`` (``minmax_sum+sink``): block 0, which holds the first tokens (the attention
sink of most models: the BOS key draws a large share of every head's attention), then scores ``+inf``, so it is always
selected once it is complete; the same summaries, no extra bytes.

Empty (not yet written) entries: ``a = +inf, b = -inf`` for every scorer (``empty_summaries``); their scores are
meaningless and ``topk_blocks`` never returns them as long as ``n_blocks`` says so. Array-namespace code (numpy or
torch, CPU or CUDA): the same inputs give the same outputs on both (tests/unit/test_block_scorers.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .scoring import blocks_of, build_summaries
from .xp import namespace

BASE_SCORERS = ("minmax", "minmax_sum", "mean", "gauss")
SCORERS = BASE_SCORERS + tuple(s + "+sink" for s in BASE_SCORERS)
TOKENS = "tokens"  # the per-token scorer (oasis_core.token_scorer): its own storage, not two vectors a block
ENGINE_SCORERS = SCORERS + (TOKENS,)  # the scorers the executor and the simulator run
AUTO = "auto"  # --block-score's default: the per-model choice (oasis_exec.scorer_auto), resolved when a config is built
SCORER_CHOICES = ENGINE_SCORERS + (AUTO,)  # what --block-score takes
# The engine's and the simulator's default: minmax_sum+sink, chosen by the measurements (issue 38,
# experiments/block_scorers/README.md). It held more of the next query's attention than the paper's bound (minmax)
# on both real models at every K, in mass, recall, proxy and lookahead agreement, at the same summary bytes (SmolLM2
# 4K-8K; Gemma 4K-32K: 72.5% against 57.0% at 32K, K = 256), cut retrieval's perplexity loss on the CPU, and costs the
# same step time: 16K x 44 lookahead, dummy Qwen3-8B, H100, 2026-12-06, commit 1cd1217: 2,436.6 tok/s against
# minmax's 2,440.5 (-0.16%). The per-token scorer (`tokens`, oasis_core.token_scorer) holds the most (82.3% at 32K,
# K = 256, at twice the bytes) but costs 19% of that throughput (r = 32; 15% at r = 16): an option, not the default.
# mean+sink reads half the bytes (+6.3% throughput) and holds ~2 points more on Gemma but 8 fewer on SmolLM2.
# Since 2026-12-06 the configs' default is AUTO: `tokens` with the shipped basis for a real model whose basis ships
# (Gemma 3 270M, SmolLM2-135M; oasis_exec.scorer_auto), DEFAULT_SCORER everywhere else (dummy weights, the simulator,
# another model).
MEASURED_BEST = "minmax_sum+sink"
DEFAULT_SCORER = MEASURED_BEST


@dataclass(frozen=True)
class ScorerInfo:
    """What one scorer stores and reads: ``summary`` the two vectors, ``combine`` over a group's query heads,
    ``vectors_read`` the D-vectors per block the score reads (of the two stored)."""

    name: str
    summary: str  # "minmax" | "mean" | "meanstd"
    combine: str  # "max" | "sum" | "lse"
    vectors_read: int
    sink: bool = False  # block 0 always first


INFO = {
    "minmax": ScorerInfo("minmax", "minmax", "max", 2),
    "minmax_sum": ScorerInfo("minmax_sum", "minmax", "sum", 2),
    "mean": ScorerInfo("mean", "mean", "sum", 1),
    "gauss": ScorerInfo("gauss", "meanstd", "lse", 2),
}


def read_fraction(name: str) -> float:
    """The share of a block's stored summary bytes that scoring it reads (``tokens``: all of them)."""
    return 1.0 if name == TOKENS else get_scorer(name).vectors_read / 2


def split_sink(name: str) -> tuple[str, bool]:
    """``"minmax_sum+sink"`` -> ``("minmax_sum", True)``; a name without the suffix -> ``(name, False)``."""
    return (name[: -len("+sink")], True) if name.endswith("+sink") else (name, False)


def get_scorer(name: str) -> ScorerInfo:
    base, sink = split_sink(name)
    if base not in INFO:
        raise ValueError(f"block_score: unknown scorer {name!r}; choose from {', '.join(SCORERS)}")
    info = INFO[base]
    return ScorerInfo(name, info.summary, info.combine, info.vectors_read, sink) if sink else info


def summary_bytes_per_token(name: str, head_dim: int, block_size: int, dtype_bytes: int = 2) -> dict:
    """GPU bytes per token and KV head the scorer needs (``needed``, the vectors it reads) and the executor
    allocates (``allocated``, two D-vectors per block), and both as a fraction of a token's K + V bytes."""
    info = get_scorer(name)
    kv = 2 * head_dim * dtype_bytes
    needed = info.vectors_read * head_dim * dtype_bytes / block_size
    allocated = 2 * head_dim * dtype_bytes / block_size
    return {
        "needed": needed,
        "allocated": allocated,
        "needed_frac_kv": needed / kv,
        "allocated_frac_kv": allocated / kv,
    }


def build(keys, block_size: int, name: str):
    """Summaries ``(a, b)`` of a whole context for scorer ``name``: keys [..., T, D] -> each [..., N, D]; the partial
    last block is summarised over its valid tokens only."""
    info = get_scorer(name)
    if info.summary == "minmax":
        return build_summaries(keys, block_size)
    return _moments(keys, block_size, info.summary == "meanstd")


def _moments(keys, block_size: int, with_std: bool):
    blocks, pad = blocks_of(keys, block_size, 0.0)
    xp = namespace(keys)
    n = blocks.shape[-3]
    count = xp.full((n,), float(block_size), keys.dtype, like=keys)
    if pad:
        count = xp.concat([count[:-1], xp.full((1,), float(block_size - pad), keys.dtype, like=keys)], axis=0)
    count = count[:, None]  # [N, 1]
    mean = xp.sum(blocks, axis=-2) / count
    if not with_std:
        return mean, mean
    sq = xp.sum(blocks * blocks, axis=-2) / count
    var = xp.maximum(sq - mean * mean, xp.zeros((), keys.dtype, like=keys))
    return mean, xp.sqrt(var)


def score(q, a, b, name: str, scale: float | None = None):
    """Scores [B, Hkv, N] of every block for every KV head. q: [B, Hq, D]; a, b: [B, Hkv, N, D] (``build``'s);
    ``scale``: the softmax scale (``gauss`` only; default ``1 / sqrt(D)``)."""
    info = get_scorer(name)
    bsz, hq, d = q.shape
    hkv = a.shape[1]
    if hq % hkv:
        raise ValueError(f"q: {hq} query heads are not a multiple of {hkv} KV heads")
    xp = namespace(q, a, b)
    qg = q.reshape(bsz, hkv, hq // hkv, d)
    at, bt = xp.swapaxes(a, -1, -2), xp.swapaxes(b, -1, -2)
    if info.summary == "minmax":
        zero = 0 * qg
        s = xp.where(qg > 0, qg, zero) @ bt + xp.where(qg < 0, qg, zero) @ at  # [B, Hkv, G, N]
    elif info.summary == "mean":
        s = qg @ at
    else:
        c = 1.0 / math.sqrt(d) if scale is None else float(scale)
        s = c * (qg @ at) + (0.5 * c * c) * ((qg * qg) @ (bt * bt))
    out = _combine(xp, s, info.combine)
    if info.sink:
        first = xp.arange(out.shape[-1], like=out) == 0
        out = xp.where(first, xp.full((), math.inf, out.dtype, like=out), out)
    return out


def _combine(xp, s, how: str):
    """[B, Hkv, G, N] -> [B, Hkv, N]."""
    if how == "max":
        return xp.amax(s, axis=2)
    if how == "sum":
        return xp.sum(s, axis=2)
    m = xp.amax(s, axis=2)
    return m + xp.log(xp.sum(xp.exp(s - m[:, :, None, :]), axis=2))
