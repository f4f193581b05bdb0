"""A seeded synthetic selection process: true next-step top-K, draft prediction and current-query proxy per row.

Real attention decides how many blocks change per step, and dummy weights give near-random attention, so the
backends can take their block sets from this generator instead (DESIGN.md, "Where the top-K sets come from").
A row is one (request, layer, KV head), flattened in that order: row ``r`` belongs to request
``r // (layers * kv_heads)`` and layer ``(r // kv_heads) % layers``.

The model, per row
------------------
Every row holds a ranking ``perm`` of its eligible blocks ``0 .. n_blocks - 2`` (the newest block ``n_blocks - 1``
is the always-resident local block and is never selected). The top-K set ``T_t`` is the first
``k = min(top_k, n_blocks - 1)`` entries of the ranking, in rank order (read it as best first). Below the boundary
sits a *window* of the next ``ceil(window_fraction * (n_eligible - k))`` outsiders: the near-misses.

- **Hot blocks**: the first ``floor(hot_fraction * k)`` ranks never drift (attention sinks, persistent heavy hitters).
- **Drift** (``T_t -> T_{t+1}``): only the *drift zone*, the last ``ceil(drift_zone * k)`` ranks (never a hot one),
  changes per step: each member there is swapped, with a probability chosen so that on average ``drift_rate * k``
  members per step are, with a distinct window block. The churn is thus the marginal blocks near the cut-off
  flickering in and out: evicted blocks land in the (small) window and soon come back, the ranks above the zone
  only change at a context shift, and ``k + window`` bounds the blocks a row ever selects (between shifts). This is
  why a capped resident set (fetch ratio 0.05) keeps nearly all of the important blocks (``capped_recall``).
  Expected adjacent-step overlap ``|T_t ∩ T_{t+1}| / k = 1 - drift_rate``.
- **Drift and K** (opt-in, ``drift_share_exponent``, default 0 = off): the per-slot swap probability is scaled so
  that the expected drift fraction is ``drift_rate * (8 k / eligible blocks) ** -drift_share_exponent`` (capped
  at the drift zone): ``drift_rate`` is then the drift at K = 1/8 of the context, and a K that covers a smaller
  share churns a larger fraction of itself. Real attention does (Gemma 3 270M's full layers: 38% of K a step at
  3% of the blocks, 34% at 6%, 30% at 12.5%, 22% at 25%; exponent about 0.24).
- **Novelty** (opt-in, ``novelty_rate``, default 0 = off): a slow inflow of blocks the row never selected, on top
  of the flicker. Each drift-zone slot is, with probability ``novelty_rate / zone size`` (per group, like the drift),
  swapped with a distinct block from beyond the window that the row has never had in its top-K, uniformly over
  those; the evicted member takes that block's rank position beyond the window, so it does not come back. Expected
  never-seen blocks per row per step = ``novelty_rate`` (once the initial window has been used up, and while
  unseen blocks remain). It is what remote drift after an RPF hand-off needs (the paper's Fig. 14 implies ~0.45);
  with 0 the code path is skipped and no random numbers are drawn, so outputs are bit-identical to the generator
  without it. It lowers adjacent overlap by about ``novelty_rate / k``.
- **Returns** (opt-in, ``return_rate``, default 0 = off): the near-miss window is kept in *recency order*. The
  members a step's drift evicts go to the window's front (position 0 = most recently evicted; a step's evictions in
  the order of their ranks), the window's other blocks move back behind them, and the drift's incoming blocks are
  drawn from the window without replacement (an exponential race) with weight, at window position ``d``,
  ``return_rate * exp(-d / (return_depth * k)) / Z + (1 - return_rate) / window`` (Z normalises the first part
  over the window). So a share ``return_rate`` of the incomers is a block evicted recently -- at a recency depth
  of about ``return_depth * k`` positions, i.e. a depth that scales with K as the churn does -- and the rest is
  any near-miss, mostly ones not selected for a long time or never. This is what a victim cache of S - K slots
  lives on: an incomer at depth ``d < S - K`` is still resident. One draw's share within the ``m`` most recently
  evicted: ``return_rate (1 - e^(-m / (return_depth k))) / (1 - e^(-window / (return_depth k))) + (1 -
  return_rate) m / window``. Drift counts, the proxy (it draws behind the evicted members) and the draft are as
  without it; ``return_depth`` (> 0) only matters with ``return_rate`` > 0, and with 0 nothing is drawn or made, so
  outputs are bit-identical to the generator without it. Real attention needs it: Gemma 3 270M's full layers at
  16K-32K bring in 30-38% of K a step, and more than half of those are blocks evicted a few steps earlier
  (``synthetic_presets.GEMMA3``).
- **Heads** (a row's (request, layer) is its *group*): the group has one ranking; each top-K or window position
  of it is *shared*, with probability ``head_share`` (drawn per group and position), and the blocks at the other
  positions (and everything beyond the window) are shuffled per head. The drift draws are per group, so the heads
  of a layer move in lock-step and a shared position keeps holding the same block in every head; the draft and
  proxy errors are per head. The union over a layer's heads of their sets (the RPF hand-off at block granularity,
  ``head_union``) is then about ``k * (share + heads * (1 - share))``. A context shift is applied per head in
  block space, so after one the heads' rankings are no longer aligned and sharing slowly decays.
- **Draft prediction** of ``T_{t+1}``: each entry of ``T_{t+1}`` is replaced, with the row's layer's error rate,
  by a distinct window block (never a member of ``T_{t+1}``). Expected agreement ``1 - error``. The per-layer rate
  rises linearly from ``draft_error_rate - spread/2`` (last layer) to ``draft_error_rate + spread/2`` (layer 0),
  so the layer mean is exactly ``draft_error_rate``.
- **Current-query proxy** for ``T_{t+1}``: ``T_t`` with each entry replaced, with probability
  ``proxy_error_rate``, by a window block outside both ``T_t`` and ``T_{t+1}``. It stands for scoring the next step
  with the current query; the extra error models that the paper measured the proxy on the top-20, where churn is
  relatively larger than on the top-128 (set it to 0 to make the proxy exactly ``T_t``).
  Expected recall ``(1 - drift_rate) * (1 - proxy_error_rate)``.
- **Context shift** (a newly inserted document becoming important): at the chosen step the non-hot part of the set
  is displaced by a contiguous range of ``floor(shift_fraction * k)`` blocks, the same start for every row of a
  request; the range ranks right after the hot blocks. The context length itself does not grow.

How the targets are measured (``measure``), pooled over rows and steps:
agreement ``Σ|D ∩ T_{t+1}| / Σ|T_{t+1}|``, per layer the same sum restricted to its rows; proxy recall
``Σ|P ∩ T_{t+1}| / Σ|T_{t+1}|`` ("recovers" = the fraction of true next-step blocks the proxy set contains);
adjacent overlap ``Σ|T_t ∩ T_{t+1}| / Σ|T_{t+1}|``. All sets have the same size ``k``, so recall equals precision.

Calibration of the defaults (paper, Qwen3-8B, K = 128): draft agreement 98.74% mean and >= 98.2% per layer
(error 1.26%, per-layer spread 0.68 points: worst layer 98.40%); proxy recall 83.9%.

- Drift comes from the fetch-ratio sweep (Table 2): fetch-all moves 5.05 GB per step; *assuming* batch 128 and
  8 KiB per (block, head, layer), that is 16.7 blocks per row per step (the ratio-0.01 point, one block per row at
  0.30 GB, supports the same batch). Fetch-all traffic per row is ``|D_{t+1} \\ D_t|``, nominally
  ``k (1 - (1 - drift)(1 - error)^2)``; with the small flicker window a draft error often names a block that was
  selected a step or two earlier, which costs nothing, so the measured traffic is lower than that formula: drift
  0.12 gives 16.7 blocks at 16K tokens (16.7 / 17.3 / 17.5 at 1,024 / 1,536 / 2,048 blocks); 0.11 would give 15.6.
  Adjacent overlap is then 88% (> 80%) and the proxy error ``1 - 0.839 / 0.88 = 0.0466``.
- Drift zone 0.25 and window 0.04 (36 / 57 / 77 near-misses at 16K / 24K / 32K tokens): the paper reports a
  negligible accuracy loss at fetch ratio 0.05 (6 blocks per row per step against ~17 changing), i.e. the churn
  is marginal. Measured at 16K, numpy, Algorithm 2 on the draft under ``Fixed(0.05)`` (``capped_recall``): the
  resident set holds 91% of the true top-K, 99.8% of its best half, 98% reciprocal-rank weighted (with the old
  uniform drift over all non-hot ranks and a window of half the outsiders: 59%, 98%, 90%).
- Head share 0.89 from the RPF hand-off (Fig. 14, Qwen3-8B: 0.52 GiB at 24K, 0.46 GiB at 32K, against 3.37 and
  4.50 GiB full). A block of one layer at block granularity is 8 heads x 8 KiB, so *taking these as the KV of
  the sent blocks only* (the local block included; not the summaries, not the draft state), the union over a
  layer's heads is 0.52 GiB / (36 x 64 KiB) = 237 blocks at 24K and 209 at 32K. (Were the summaries, 1/16 of
  the full KV = 0.21 / 0.28 GiB, included, 32K would leave 80 blocks: fewer than the 129 of one head, so they
  cannot be.) One share cannot make the union shrink with context; 0.89 gives 226 blocks with the local one
  (0.50 GiB) at both lengths, between the two (within -5% / +8%). The first step's *draft* adds ~10 per layer
  (its errors are per head), the hand-off in the backends uses ``current()``.

Backends and determinism
------------------------
The state lives in arrays of the caller's library and device (``like``). Random numbers come from one generator
per instance: ``numpy.random.Generator(PCG64(seed))`` on numpy, a ``torch.Generator`` on the tensor's device
(Philox on CUDA) on torch. The same seed gives the same sequence within a backend and device; numpy and torch give
*different* sequences (the statistics agree, the block ids do not). ``step()`` on torch never synchronises with
the host: no ``.item()``, ``.tolist()``, ``.cpu()`` or branch on values; the only Python branch is on the step
counter, which is host state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from numbers import Integral, Real
from typing import Any, Dict, Optional

import numpy as np

from .echo import show
from .xp import namespace


def _help(text: str, default):
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class SyntheticParams:
    """Parameters of the synthetic selection process; the defaults are calibrated to the paper (module docstring).

    Every field carries ``metadata["help"]`` (see ``param_help()``) so that CLIs can expose them unchanged.
    """

    drift_rate: float = _help(
        "mean fraction of a row's top-K replaced per step (adjacent-step overlap = 1 - drift_rate)", 0.12
    )
    hot_fraction: float = _help(
        "fraction of the top-K (its best ranks) that never drifts: sinks and persistent heavy hitters", 0.25
    )
    drift_zone: float = _help(
        "fraction of the top-K, its lowest ranks just above the cut-off, in which per-step drift happens: marginal "
        "blocks flicker in and out while the ranks above stay put (1 - hot_fraction or more = every non-hot rank)",
        0.25,
    )
    window_fraction: float = _help(
        "fraction of the blocks outside the top-K that drift draws from (near-misses just below the boundary); "
        "small = blocks that leave soon come back (strong temporal locality), 1 = any block",
        0.04,
    )
    head_share: float = _help(
        "fraction of a row's ranking (top-K and window positions) whose block is shared by every KV head of its "
        "(request, layer); the rest is the head's own; drift moves a layer's heads in lock-step",
        0.89,
    )
    draft_error_rate: float = _help(
        "mean over layers of the fraction of the true next top-K the draft gets wrong (agreement = 1 - this)", 0.0126
    )
    draft_layer_spread: float = _help(
        "difference of the draft error rate between the worst (first) and the best (last) layer", 0.0068
    )
    proxy_error_rate: float = _help(
        "fraction of the current top-K the current-query proxy gets wrong on top of drift "
        "(proxy recall = (1 - drift_rate) * (1 - proxy_error_rate))",
        0.0466,
    )
    shift_step: int = _help(
        "step at which a context shift (newly inserted document) happens for every row; -1 = never", -1
    )
    shift_fraction: float = _help(
        "fraction of the top-K that a context shift replaces with one contiguous range of blocks", 0.5
    )
    novelty_rate: float = _help(
        "opt-in slow inflow of new blocks: expected drift-zone slots per row per step that take a block never "
        "selected before in that row, drawn uniformly from the context beyond the near-miss window (the evicted "
        "member leaves the window for good); 0 = off, the generator is then exactly the flicker-only process; "
        "per-slot probability novelty_rate / drift-zone size, capped at 1",
        0.0,
    )
    drift_share_exponent: float = _help(
        "opt-in: the drift falls with the share of the context K covers, drift fraction = drift_rate * (8 K / "
        "eligible blocks) ** -exponent (drift_rate is then the drift at K = 1/8 of the blocks, the paper's 128 of "
        "1,024), capped at the drift zone; 0 = drift_rate at every K (as before, bit-identical)",
        0.0,
    )
    return_rate: float = _help(
        "opt-in recency-ordered near-miss window: blocks the drift evicts go to the window's front (most recent "
        "first) and each drift incomer is, with this probability, a recently evicted block (recency position d "
        "weighted exp(-d / (return_depth * K))), else a uniform window block; 0 = off (the flicker process as "
        "before, bit-identical)",
        0.0,
    )
    return_depth: float = _help(
        "with return_rate > 0: the mean recency position, in units of K, of a returning block (the scale of the "
        "exponential weight over the window's recency order; 0.25 = mostly blocks evicted a step or two ago)",
        0.25,
    )

    def __post_init__(self):
        def check(name, lo, hi, lo_open=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, Real):
                raise ValueError(f"SyntheticParams.{name}: must be a number, got {show(v)}")
            if not (lo < v if lo_open else lo <= v) or not v <= hi:
                lo_sign = "(" if lo_open else "["
                raise ValueError(f"SyntheticParams.{name}: must be in {lo_sign}{lo}, {hi}], got {show(v)}")

        check("hot_fraction", 0.0, 1.0)
        if self.hot_fraction >= 1.0:
            raise ValueError(f"SyntheticParams.hot_fraction: must be < 1, got {show(self.hot_fraction)}")
        check("drift_zone", 0.0, 1.0, lo_open=True)
        check("drift_rate", 0.0, min(1.0 - self.hot_fraction, self.drift_zone))
        check("window_fraction", 0.0, 1.0, lo_open=True)
        check("head_share", 0.0, 1.0)
        check("draft_error_rate", 0.0, 1.0)
        check("draft_layer_spread", 0.0, 1.0)
        half = self.draft_layer_spread / 2
        if self.draft_error_rate - half < 0 or self.draft_error_rate + half > 1:
            raise ValueError(
                f"SyntheticParams.draft_layer_spread: draft_error_rate ± spread/2 must stay in [0, 1], "
                f"got {show(self.draft_layer_spread)} around {show(self.draft_error_rate)}"
            )
        check("proxy_error_rate", 0.0, 1.0)
        check("shift_fraction", 0.0, 1.0 - self.hot_fraction)
        if (
            isinstance(self.novelty_rate, bool)
            or not isinstance(self.novelty_rate, Real)
            or not 0.0 <= self.novelty_rate < float("inf")
        ):
            raise ValueError(
                f"SyntheticParams.novelty_rate: must be a finite number >= 0, got {show(self.novelty_rate)}"
            )
        for name in ("drift_share_exponent",):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, Real) or not abs(v) < float("inf"):
                raise ValueError(f"SyntheticParams.{name}: must be a finite number, got {show(v)}")
        check("return_rate", 0.0, 1.0)
        if (
            isinstance(self.return_depth, bool)
            or not isinstance(self.return_depth, Real)
            or not 0.0 < self.return_depth < float("inf")
        ):
            raise ValueError(
                f"SyntheticParams.return_depth: must be a finite number > 0, got {show(self.return_depth)}"
            )
        if isinstance(self.shift_step, bool) or not isinstance(self.shift_step, Integral) or self.shift_step < -1:
            raise ValueError(f"SyntheticParams.shift_step: must be an integer >= -1, got {show(self.shift_step)}")

    def layer_error_rates(self, layers: int) -> np.ndarray:
        """Draft error rate per layer, float64 [layers]: linear from worst (layer 0) to best, mean = draft_error_rate."""
        if layers == 1:
            return np.array([self.draft_error_rate])
        ramp = 0.5 - np.arange(layers) / (layers - 1)  # +0.5 at layer 0 .. -0.5 at the last layer
        return self.draft_error_rate + self.draft_layer_spread * ramp

    @property
    def expected_agreement(self) -> float:
        return 1.0 - self.draft_error_rate

    @property
    def expected_min_layer_agreement(self) -> float:
        return 1.0 - self.draft_error_rate - self.draft_layer_spread / 2

    @property
    def expected_overlap(self) -> float:
        """1 - drift_rate; with ``drift_share_exponent`` != 0, at K = 1/8 of the eligible blocks."""
        return 1.0 - self.drift_rate

    @property
    def expected_proxy_recall(self) -> float:
        return (1.0 - self.drift_rate) * (1.0 - self.proxy_error_rate)


def param_help() -> Dict[str, str]:
    """Field name -> help text of ``SyntheticParams``, in declaration order (for CLIs)."""
    return {f.name: f.metadata["help"] for f in fields(SyntheticParams)}


@dataclass(frozen=True)
class SyntheticStep:
    """One step's sets, int64 [R, K], -1 padded beyond ``min(K, n_blocks - 1)``, never the local block.

    true_next: the true top-K of the next step, in rank order (best first).
    draft: the draft's prediction of ``true_next`` (same positions, a few entries replaced).
    proxy: the current-query proxy's prediction of ``true_next``.
    """

    step: int
    true_next: Any
    draft: Any
    proxy: Any


class _Random:
    """Uniform [0, 1) floats from one seeded generator of the backend that owns ``like``."""

    def __init__(self, seed: int, like):
        if like is not None and namespace(like).name == "torch":
            torch = namespace(like).t  # the torch module, loaded lazily by oasis_core.xp

            self._device = like.device
            self._gen = torch.Generator(device=self._device)
            self._gen.manual_seed(seed)
            self._torch = torch
        else:
            self._torch = None
            self._gen = np.random.Generator(np.random.PCG64(seed))

    def uniform(self, shape):
        if self._torch is None:
            return self._gen.random(shape)
        return self._torch.rand(shape, generator=self._gen, device=self._device)


class SyntheticSelection:
    """The synthetic selection process over ``rows`` rows (module docstring for the model).

    rows: number of (request, layer, KV head) rows, in that order.
    n_blocks: int or int array [R] — blocks of each row's context, the local (newest) block included.
    top_k: K, the width of every returned set.
    layers, kv_heads: the row layout (layer of a row picks its draft error rate; a request's rows share a shift).
    like: an array or tensor whose library and device the state and outputs use (default: ``n_blocks`` if it is
    an array, else numpy).
    """

    def __init__(
        self,
        rows: int,
        n_blocks,
        top_k: int,
        params: Optional[SyntheticParams] = None,
        seed: int = 0,
        *,
        layers: int = 1,
        kv_heads: int = 1,
        like=None,
    ):
        if rows < 1 or top_k < 1 or layers < 1 or kv_heads < 1:
            raise ValueError(
                f"SyntheticSelection: rows, top_k, layers, kv_heads must be >= 1, "
                f"got {rows}, {top_k}, {layers}, {kv_heads}"
            )
        if like is None and not isinstance(n_blocks, Integral):
            like = n_blocks
        self.params = params if params is not None else SyntheticParams()
        self.rows, self.top_k, self.layers, self.kv_heads = rows, top_k, layers, kv_heads
        xp = self.xp = namespace(like)
        self._rng = _Random(seed, like)
        p = self.params

        if isinstance(n_blocks, Integral):
            nb = xp.full((rows,), int(n_blocks), xp.int64, like=like)
        else:
            nb = xp.astype(xp.asarray(n_blocks, like=like), xp.int64)
            if tuple(nb.shape) != (rows,):
                raise ValueError(f"SyntheticSelection.n_blocks: expected shape ({rows},), got {tuple(nb.shape)}")
        # Construction may synchronise (once); step() never does.
        max_blocks = int(xp.amax(nb, 0))
        if int(xp.amin(nb, 0)) < 1:
            raise ValueError(f"SyntheticSelection.n_blocks: every row needs >= 1 block, got min {int(xp.amin(nb, 0))}")
        self.width = max(max_blocks, top_k + 1)  # ranking width; ids >= n_eligible are padding that never ranks

        r = xp.arange(rows, like=like)
        self.layer_of_row = (r // kv_heads) % layers
        self.request_of_row = r // (layers * kv_heads)
        self.requests = (rows + layers * kv_heads - 1) // (layers * kv_heads)
        self.group_of_row = r // kv_heads  # (request, layer): the heads that share blocks and drift draws
        self.groups = (rows + kv_heads - 1) // kv_heads

        n_elig = nb - 1
        self.k = xp.minimum(n_elig, xp.full((rows,), top_k, xp.int64, like=like))  # [R] set size
        self.hot = xp.astype(self.k * p.hot_fraction, xp.int64)
        n_out = n_elig - self.k
        self.win = n_out - xp.astype(n_out * (1.0 - p.window_fraction), xp.int64)  # ceil(frac * n_out)
        self._win1 = xp.where(self.win > 0, self.win, 1)
        zone = self.k - xp.astype(self.k * (1.0 - p.drift_zone), xp.int64)  # ceil(drift_zone * k)
        self.drift_lo = xp.maximum(self.hot, self.k - zone)  # first rank that drifts
        movable = self.k - self.drift_lo
        self.p_swap = (self.k * p.drift_rate) / xp.where(movable > 0, movable, 1)  # <= 1: drift <= zone
        if p.drift_share_exponent != 0:  # a parameter (host state): 0 leaves p_swap exactly as above
            share = xp.astype(8 * self.k, xp.float64) / xp.astype(xp.where(n_elig > 0, n_elig, 1), xp.float64)
            scale = xp.exp(-p.drift_share_exponent * xp.log(xp.where(self.k > 0, share, 1.0 + 0.0 * share)))
            self.p_swap = xp.minimum(self.p_swap * scale, 1.0 + 0.0 * scale)
        self.p_novel = xp.minimum(
            p.novelty_rate / xp.where(movable > 0, movable, 1) + 0.0 * self.p_swap, 1.0 + 0.0 * self.p_swap
        )
        err = xp.asarray(p.layer_error_rates(layers), like=like)
        self.p_draft = err[self.layer_of_row]
        self.n_elig = n_elig

        self.slot = xp.arange(top_k, like=like)[None, :] + xp.zeros((rows, 1), xp.int64, like=like)  # [R, K]
        self._blocks = xp.arange(self.width, like=like)[None, :]  # [1, W]
        self.perm = self._initial_ranking()  # [R, W] block ids in rank order
        self._ret_inv_w = self._return_weights() if p.return_rate > 0 else None  # return_rate 0: not made
        self.t = 0
        # novelty_rate > 0 only: per row, the blocks ever in its top-K (column ``width`` absorbs the -1 padding).
        self.seen = None
        if p.novelty_rate > 0:
            self.seen = self._mark_seen(xp.zeros((rows, self.width + 1), xp.bool_, like=self.perm), self.current())
        self._pending_shift = None

    def _group_uniform(self, shape):
        """Uniform draws per (request, layer), repeated for each of its heads: [R, *shape]."""
        return self._rng.uniform((self.groups,) + tuple(shape))[self.group_of_row]

    def _initial_ranking(self):
        """The layer's ranking, with its private positions refilled per head (module docstring, "Heads")."""
        xp = self.xp
        pos = self._blocks + xp.zeros((self.rows, 1), xp.int64, like=self.k)  # [R, W] positions (and block ids)
        pad = pos >= self.n_elig[:, None]
        keys = xp.where(pad, 2.0 + pos, self._group_uniform((self.width,)))  # padding ids rank last, in order
        layer_perm = xp.argsort_asc(keys)
        near = pos < (self.k + self.win)[:, None]  # top-K and window positions
        fixed = pad | (near & (self._group_uniform((self.width,)) < self.params.head_share))
        # Private positions ascending, and the same positions in a random order per row; fixed positions follow,
        # ascending, in both lists, so scattering one onto the other shuffles the private blocks only.
        private_pos = xp.argsort_asc(xp.where(fixed, self.width + pos, pos))
        shuffled = xp.argsort_asc(xp.where(fixed, self.width + pos, self._rng.uniform((self.rows, self.width))))
        return xp.scatter(layer_perm, -1, private_pos, xp.take_along(layer_perm, shuffled))

    # -- the process -------------------------------------------------------------------------------------------

    def current(self):
        """T_t, int64 [R, K], -1 padded."""
        return self._top(self.perm)

    def inject_shift(self, rows=None):
        """Make the next ``step()`` a context shift for the rows in bool mask ``rows`` [R] (default: all rows)."""
        xp = self.xp
        self._pending_shift = xp.full((self.rows,), True, xp.bool_, like=self.perm) if rows is None else rows

    def step(self) -> SyntheticStep:
        """Advance T_t -> T_{t+1} and return (true T_{t+1}, draft prediction, current-query proxy)."""
        xp = self.xp
        cur = self._top(self.perm)
        if self._ret_inv_w is None:  # host state (a parameter): return_rate == 0 is the flicker process unchanged
            drifted, n_swapped, off = self._drift(self.perm)
        else:
            drifted, n_swapped, off = self._drift_recent(self.perm)
        proxy = self._proxy(cur, drifted, n_swapped, off)
        if self.seen is not None:  # host state (a parameter), not a value: novelty_rate == 0 draws nothing
            drifted = self._novelty(drifted)
        shift = self._pending_shift
        if self.t == self.params.shift_step:
            shift = xp.full((self.rows,), True, xp.bool_, like=self.perm)
        self._pending_shift = None
        nxt_perm = drifted if shift is None else self._shift(drifted, shift)
        true_next = self._top(nxt_perm)
        draft = self._draft(nxt_perm, true_next)
        self.perm = nxt_perm
        if self.seen is not None:
            self.seen = self._mark_seen(self.seen, true_next)
        out = SyntheticStep(step=self.t, true_next=true_next, draft=draft, proxy=proxy)
        self.t += 1
        return out

    # -- pieces (array code, no host sync) ---------------------------------------------------------------------

    def _top(self, perm):
        xp = self.xp
        return xp.where(self.slot < self.k[:, None], perm[:, : self.top_k], -1)

    def _window_positions(self, flag, start, count):
        """Distinct ranking positions for the flagged slots: window positions ``start, start+1, ...`` (mod window),
        at most ``count`` of them. Returns (positions [R, K], flags kept)."""
        xp = self.xp
        c = xp.cumsum(xp.astype(flag, xp.int64), axis=-1) - 1
        flag = flag & (c < count[:, None])
        c = xp.where(c > 0, c, 0)
        pos = self.k[:, None] + (start[:, None] + c) % self._win1[:, None]
        return pos, flag

    def _offsets(self, u):
        xp = self.xp
        off = xp.astype(u * self.win, xp.int64)
        return xp.minimum(off, self._win1 - 1)  # guard a float rounding up to win

    def _drift(self, perm):
        xp = self.xp
        u = self._group_uniform((self.top_k,))
        flag = (self.slot >= self.drift_lo[:, None]) & (self.slot < self.k[:, None]) & (u < self.p_swap[:, None])
        off = self._offsets(self._group_uniform(()))
        pos, flag = self._window_positions(flag, off, self.win)
        members = perm[:, : self.top_k]
        incoming = xp.take_along(perm, pos)
        out = xp.scatter(perm, -1, self.slot, xp.where(flag, incoming, members))
        out = xp.scatter(out, -1, xp.where(flag, pos, self.slot), members)
        return out, xp.sum(xp.astype(flag, xp.int64), axis=-1), off

    def _return_weights(self):
        """1 / weight of each ranking position for a recency drift draw, float64 [R, W] (0 outside the window):
        window position d (0 = most recently evicted) has weight ``r exp(-d / (depth k)) / Z + (1 - r) / win``."""
        xp, p = self.xp, self.params
        d = xp.astype(self._blocks - self.k[:, None], xp.float64)  # [R, W] window position
        win = xp.astype(self._win1, xp.float64)[:, None]
        scale = p.return_depth * xp.astype(xp.maximum(self.k, xp.full((self.rows,), 1, xp.int64, like=self.k)),
                                           xp.float64)[:, None]  # fmt: skip
        in_win = (d >= 0) & (d < win)
        decay = xp.exp(-xp.where(in_win, d, 0.0 * d) / scale)
        z = (1.0 - xp.exp(-win / scale)) / (1.0 - xp.exp(-1.0 / scale))  # sum of decay over the window
        w = p.return_rate * decay / z + (1.0 - p.return_rate) / win
        return xp.where(in_win, 1.0 / xp.maximum(w, 1e-300 + 0.0 * w), 0.0 * w)

    def _drift_recent(self, perm):
        """The drift with a recency-ordered window (``return_rate`` > 0): the flagged drift-zone slots (as in
        ``_drift``) take distinct window blocks drawn without replacement with the weights of ``_return_weights``
        (an exponential race); the evicted members go to the window's front in slot order, the window's other
        blocks move back behind them in their order. Returns (ranking, swapped count [R], offset 0: the proxy then
        draws behind the evicted members)."""
        xp = self.xp
        u = self._group_uniform((self.top_k,))
        flag = (self.slot >= self.drift_lo[:, None]) & (self.slot < self.k[:, None]) & (u < self.p_swap[:, None])
        c = xp.cumsum(xp.astype(flag, xp.int64), axis=-1) - 1
        flag = flag & (c < self.win[:, None])
        c = xp.where(c > 0, c, 0)
        n = xp.sum(xp.astype(flag, xp.int64), axis=-1)
        expo = -xp.log(1.0 - self._group_uniform((self.width,)))  # Exp(1) per position
        keys = xp.where(self._ret_inv_w > 0, expo * self._ret_inv_w, float("inf") + 0.0 * self._ret_inv_w)
        order = xp.argsort_asc(keys)[:, : self.top_k]  # window positions in the race's order
        pos = xp.take_along(order, c)  # the flagged slot's incoming position
        pos_all = self._blocks + xp.zeros((self.rows, 1), xp.int64, like=perm)  # [R, W]
        hit = xp.zeros((self.rows, self.width + 1), xp.bool_, like=perm)
        hit = xp.scatter(hit, -1, xp.where(flag, pos, self.width), xp.full(tuple(pos.shape), True, xp.bool_,
                                                                         like=perm))[:, : self.width]  # fmt: skip
        keep = (pos_all >= self.k[:, None]) & (pos_all < (self.k + self.win)[:, None]) & ~hit
        rank_keep = xp.cumsum(xp.astype(keep, xp.int64), axis=-1) - 1
        newpos = xp.where(keep, (self.k + n)[:, None] + rank_keep, pos_all)
        newpos = xp.concat([newpos, pos_all[:, :1]], axis=-1)  # column W absorbs the unflagged slots' writes
        newpos = xp.scatter(newpos, -1, xp.where(flag, pos, self.width), self.slot)  # incoming -> its slot
        newpos = xp.scatter(newpos, -1, xp.where(flag, self.slot, self.width), self.k[:, None] + c)  # evicted
        out = xp.scatter(perm, -1, newpos[:, : self.width], perm)
        return out, n, xp.zeros((self.rows,), xp.int64, like=perm)

    def _mark_seen(self, seen, sets):
        xp = self.xp
        ids = xp.where(sets >= 0, sets, self.width)
        return xp.scatter(seen, -1, ids, xp.full(tuple(ids.shape), True, xp.bool_, like=sets))

    def _novelty(self, perm):
        """Swap drift-zone members (each with probability ``p_novel``, drawn per group like the drift) with distinct
        blocks beyond the window that the row never selected, uniformly over those; the member takes the new
        block's rank position (beyond the window, so it does not flicker back)."""
        xp = self.xp
        u = self._group_uniform((self.top_k,))
        flag = (self.slot >= self.drift_lo[:, None]) & (self.slot < self.k[:, None]) & (u < self.p_novel[:, None])
        pos_all = self._blocks + xp.zeros((self.rows, 1), xp.int64, like=perm)  # [R, W] rank positions
        seen_at = xp.take_along(self.seen, perm)  # [R, W] block at position p already selected by this row
        cand = (pos_all >= (self.k + self.win)[:, None]) & (pos_all < self.n_elig[:, None]) & ~seen_at
        # distinct keys (the others after every candidate, in position order): the first top_k of a stable argsort
        keys = xp.where(cand, self._rng.uniform((self.rows, self.width)), 2.0 + pos_all)
        order = xp.smallest_k(keys, self.top_k)  # candidate positions in random order, then the rest
        n_cand = xp.sum(xp.astype(cand, xp.int64), axis=-1)
        c = xp.cumsum(xp.astype(flag, xp.int64), axis=-1) - 1
        flag = flag & (c < n_cand[:, None])
        pos = xp.take_along(order, xp.where(c > 0, c, 0))
        members = perm[:, : self.top_k]
        incoming = xp.take_along(perm, pos)
        out = xp.scatter(perm, -1, self.slot, xp.where(flag, incoming, members))
        return xp.scatter(out, -1, xp.where(flag, pos, self.slot), members)

    def _proxy(self, cur, drifted, n_swapped, off):
        """T_t with entries replaced by window blocks that the drift did not touch (outside T_t and T_{t+1})."""
        xp = self.xp
        u = self._rng.uniform((self.rows, self.top_k))
        flag = (self.slot < self.k[:, None]) & (u < self.params.proxy_error_rate)
        pos, flag = self._window_positions(flag, off + n_swapped, self.win - n_swapped)
        return xp.where(flag, xp.take_along(drifted, pos), cur)

    def _draft(self, perm, members):
        """``members`` = T_{t+1} with entries replaced by window blocks of ``perm`` (outside T_{t+1})."""
        xp = self.xp
        u = self._rng.uniform((self.rows, self.top_k))
        flag = (self.slot < self.k[:, None]) & (u < self.p_draft[:, None])
        pos, flag = self._window_positions(flag, self._offsets(self._rng.uniform((self.rows,))), self.win)
        return xp.where(flag, xp.take_along(perm, pos), members)

    def _shift(self, perm, rows_mask):
        """Rank a contiguous block range right after the hot blocks, for the masked rows."""
        xp = self.xp
        m = xp.where(rows_mask, xp.astype(self.k * self.params.shift_fraction, xp.int64), 0)  # [R]
        u = self._rng.uniform((self.requests,))[self.request_of_row]
        start = xp.astype(u * (self.n_elig - m + 1), xp.int64)
        start = xp.minimum(start, xp.where(self.n_elig - m > 0, self.n_elig - m, 0))
        pos = self._blocks + xp.zeros((self.rows, 1), xp.int64, like=perm)
        rank = xp.scatter(xp.zeros((self.rows, self.width), xp.int64, like=perm), -1, perm, pos)  # rank of block b
        hot = self.hot[:, None]
        in_range = (self._blocks >= start[:, None]) & (self._blocks < (start + m)[:, None]) & (rank >= hot)
        key = xp.where(rank < hot, rank, rank + m[:, None])
        key = xp.where(in_range, hot + (self._blocks - start[:, None]), key)
        return xp.argsort_asc(key)


# -- measurement shared by tests and calibration reports -----------------------------------------------------------


@dataclass(frozen=True)
class SyntheticStats:
    """Pooled statistics over ``row_steps`` (row, step) pairs; fractions in [0, 1]."""

    row_steps: int
    agreement: float
    layer_agreement: np.ndarray  # [layers]
    min_layer_agreement: float
    proxy_recall: float
    adjacent_overlap: float

    def as_percent(self) -> Dict[str, float]:
        return {
            "agreement": 100 * self.agreement,
            "min_layer_agreement": 100 * self.min_layer_agreement,
            "proxy_recall": 100 * self.proxy_recall,
            "adjacent_overlap": 100 * self.adjacent_overlap,
        }


def set_hits(a, b, width: int):
    """Per row, how many valid ids of ``b`` [R, K] are in ``a`` [R, K] (ids in [0, width), -1 = none): int64 [R]."""
    xp = namespace(a, b)
    rows = a.shape[0]
    mark = xp.zeros((rows, width + 1), xp.int64, like=a)
    ones = xp.full(tuple(a.shape), 1, xp.int64, like=a)
    mark = xp.scatter(mark, -1, xp.where(a >= 0, a, width), ones)
    hit = xp.take_along(mark, xp.where(b >= 0, b, width))
    return xp.sum(xp.where(b >= 0, hit, 0), axis=-1)


def _host(x) -> np.ndarray:
    return np.asarray(x.detach().cpu().numpy() if namespace(x).name == "torch" else x)


def measure(sel: SyntheticSelection, steps: int) -> SyntheticStats:
    """Run ``steps`` steps of ``sel`` and measure agreement, per-layer agreement, proxy recall and adjacent overlap
    as defined in the module docstring. Synchronises once at the end (not a decode-step path)."""
    xp = sel.xp
    zeros = xp.zeros((sel.rows,), xp.int64, like=sel.perm)
    n_true, n_draft, n_proxy, n_adj = zeros, zeros, zeros, zeros
    prev = sel.current()
    for _ in range(steps):
        s = sel.step()
        n_true = n_true + xp.sum(xp.astype(s.true_next >= 0, xp.int64), axis=-1)
        n_draft = n_draft + set_hits(s.draft, s.true_next, sel.width)
        n_proxy = n_proxy + set_hits(s.proxy, s.true_next, sel.width)
        n_adj = n_adj + set_hits(prev, s.true_next, sel.width)
        prev = s.true_next
    n_true, n_draft, n_proxy, n_adj = (_host(x).astype(np.float64) for x in (n_true, n_draft, n_proxy, n_adj))
    layer = _host(sel.layer_of_row)
    per_true = np.bincount(layer, weights=n_true, minlength=sel.layers)
    per_draft = np.bincount(layer, weights=n_draft, minlength=sel.layers)
    layer_agreement = per_draft / np.maximum(per_true, 1)
    total = max(n_true.sum(), 1.0)
    return SyntheticStats(
        row_steps=sel.rows * steps,
        agreement=float(n_draft.sum() / total),
        layer_agreement=layer_agreement,
        min_layer_agreement=float(layer_agreement.min()),
        proxy_recall=float(n_proxy.sum() / total),
        adjacent_overlap=float(n_adj.sum() / total),
    )


def head_union(sets, kv_heads: int, width: int):
    """Per group of ``kv_heads`` consecutive rows (one (request, layer)), the number of distinct valid block ids in
    their sets ``sets`` [R, K] (ids in [0, width), -1 = none): int64 [R // kv_heads]. This is the RPF hand-off at
    block granularity of the first step's sets, *without* the local block. Array code, no host sync."""
    xp = namespace(sets)
    rows, k = sets.shape
    if rows % kv_heads:
        raise ValueError(f"head_union: rows ({rows}) must be a multiple of kv_heads ({kv_heads})")
    ids = xp.where(sets >= 0, sets, width).reshape(rows // kv_heads, kv_heads * k)
    mark = xp.zeros((rows // kv_heads, width + 1), xp.int64, like=sets)
    mark = xp.scatter(mark, -1, ids, xp.full(tuple(ids.shape), 1, xp.int64, like=sets))
    return xp.sum(mark[:, :width], axis=-1)


@dataclass(frozen=True)
class CappedRecall:
    """What a capped resident set holds of the true top-K, pooled over rows and measured steps; fractions in [0, 1].

    recall: of the whole true set; top_half_recall: of its best ``ceil(k / 2)`` ranks; weighted_recall: with weight
    ``1 / (rank + 1)`` (reciprocal rank); fetch_per_row / missing_per_row: blocks fetched / predicted but not
    resident, per row per step.
    """

    row_steps: int
    recall: float
    top_half_recall: float
    weighted_recall: float
    fetch_per_row: float
    missing_per_row: float


def capped_recall(sel: SyntheticSelection, steps: int, cap=None, warmup: int = 20) -> CappedRecall:
    """Run paper Algorithm 2 (``selection.plan_step``) on ``sel``'s draft predictions under a fetch-cap policy
    (default ``Fixed(0.05)``), starting from the current sets fully resident, and measure after ``warmup`` steps how
    much of each step's true top-K the resident set holds. Synchronises once at the end."""
    from .fetchcap import CapContext, Fixed
    from .selection import initial_plan, plan_step

    cap = Fixed() if cap is None else cap
    xp = sel.xp
    max_cap = cap.max_cap(sel.top_k)
    first = initial_plan(sel.current())
    resident, last_sel = first.resident, first.last_sel
    rank = xp.arange(sel.top_k, like=sel.perm)[None, :]
    weight = 1.0 / (rank + 1.0)
    half = rank < ((sel.k + 1) // 2)[:, None]
    acc = dict.fromkeys(("hit", "n", "hit_half", "n_half", "w_hit", "w_n", "fetch", "missing"), 0)
    for i in range(1, warmup + steps + 1):
        s = sel.step()
        plan = plan_step(
            resident, last_sel, s.draft, cap.cap(CapContext(step=i, top_k=sel.top_k, rows=sel.rows)), i, max_cap
        )
        resident, last_sel = plan.resident, plan.last_sel
        if i <= warmup:
            continue
        true = s.true_next
        valid = true >= 0
        mark = xp.zeros((sel.rows, sel.width + 1), xp.int64, like=true)
        mark = xp.scatter(
            mark,
            -1,
            xp.where(resident >= 0, resident, sel.width),
            xp.full(tuple(resident.shape), 1, xp.int64, like=true),
        )
        hit = (xp.take_along(mark, xp.where(valid, true, sel.width)) > 0) & valid
        for key, num in (("hit", hit), ("n", valid), ("hit_half", hit & half), ("n_half", valid & half)):
            acc[key] = acc[key] + xp.sum(xp.astype(num, xp.int64), axis=-1)
        acc["w_hit"] = acc["w_hit"] + xp.sum(xp.where(hit, weight, 0.0 * weight), axis=-1)
        acc["w_n"] = acc["w_n"] + xp.sum(xp.where(valid, weight, 0.0 * weight), axis=-1)
        acc["fetch"] = acc["fetch"] + plan.n_fetch
        acc["missing"] = acc["missing"] + plan.n_missing
    a = {k: float(_host(v).astype(np.float64).sum()) for k, v in acc.items()}
    row_steps = sel.rows * steps
    return CappedRecall(
        row_steps=row_steps,
        recall=a["hit"] / max(a["n"], 1.0),
        top_half_recall=a["hit_half"] / max(a["n_half"], 1.0),
        weighted_recall=a["w_hit"] / max(a["w_n"], 1e-12),
        fetch_per_row=a["fetch"] / max(row_steps, 1),
        missing_per_row=a["missing"] / max(row_steps, 1),
    )
