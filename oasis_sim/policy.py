"""The simulator's bridge to the ``oasis_core`` policies: which blocks each row fetches per step, and how many of
the true top-K are resident when a layer attends.

Every decision is made by ``oasis_core``: the sets come from ``synthetic.SyntheticSelection`` (or a replay file),
the plan from ``selection.initial_plan`` / ``selection.plan_step`` under a ``fetchcap`` policy. This module only
decides *which rows* are simulated and how their figures are scaled to the whole batch:

- **rows**: ``policy_layers`` (P) layers per request are simulated, each with all the model's KV heads; they
  stand for the request's ``layers × kv_heads`` rows (a hybrid model's full layers only: its windowed layers
  select nothing). The generator is built with ``layers=P``, so its per-layer
  draft error ramp spans the P sampled layers from the worst to the best and their mean is the model's layer mean
  (P = 2 samples exactly the two ends). Per-row figures (blocks fetched, recall, remote units) are averaged over
  the ``P × kv_heads`` rows and scaled by ``layers × kv_heads`` (full layers).
- **RPF** (``split='rpf'``): each episode also keeps an ``oasis_core.rpf.RemoteLedger`` over its sampled rows: the
  hand-off sends the first predicted set (block granularity: union over the heads of a layer) and every later
  step asks the ledger for the plan's fetched blocks, so a unit crosses the network at most once.
- ``policy_sampling='exact'``: every request runs its own episode (its own seeded generator and plan state),
  stepped once per decode step. Cost: one generator step + one ``plan_step`` per request per step.
- ``policy_sampling='profile'`` (default, fast): one calibration episode per context-length bucket (quarter
  octaves of the block count) of ``profile_steps`` steps and ``profile_replicas`` requests (averaged), all buckets
  stepped together in one vectorised generator; a request at decode step ``i`` uses its bucket's step-``i``
  figures, and the mean of the episode's second half beyond the episode (a victim cache's episode is longer:
  ``victim_profile_steps``) — except RPF remote units, which honour the ledger's at-most-once rule: with
  ``split='rpf'`` the episode's ledger is stepped over the workload's longest decode and its per-step misses used
  as they are (no extrapolation; 0 beyond). ``tests/integration/test_sim_policy.py`` bounds the difference to 'exact' on throughput and
  bytes.

Step indexing: ``fetch[0]`` is the first fill at admission (``initial_plan``), ``fetch[i]`` (i >= 1) the blocks
planned during decode step ``i - 1`` for step ``i``, ``recall[i]`` the share of step ``i``'s true top-K resident
when it attends. Retrieval plans with the true set and no cap (fetched in the critical path), proxy with the
current-query set, lookahead with the draft set. Hisparse plans as retrieval does, over a hot cache of
``hot_slots`` slots per row (``SimConfig.resident_slots``) evicted least-recently-used: its fetches are the hot
cache's misses (the engine times them as retrieval's, on the critical path). Proxy and lookahead with ``hot_slots``
above ``top_k`` keep a victim cache: the same plans over more slots, recall of the ``top_k`` slots attention reads
(``oasis_core.selection.attend_slots``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from oasis_core import modes
from oasis_core.echo import show
from oasis_core.fetchcap import CapContext, Fixed, Unlimited, get_policy, state_array
from oasis_core.rpf import RemoteLedger
from oasis_core.selection import attended_blocks, count_missing, initial_plan, plan_step
from oasis_core.synthetic import SyntheticSelection, SyntheticStep

from .config import MAX_PROFILE_STEPS, ConfigError, SimConfig


def resident_recall(resident: np.ndarray, true_next: np.ndarray) -> np.ndarray:
    """Per row: the share of ``true_next``'s valid entries present in ``resident`` (a metric, not a policy)."""
    valid = true_next >= 0
    r = resident.shape[0]
    # A membership table per row (ids shifted by one: an empty slot, < 0, lands in column 0, never asked for).
    span = int(max(resident.max(initial=0), true_next.max(initial=0))) + 2
    table = np.zeros((r, span), dtype=bool)
    rows = np.arange(r)[:, None]
    table[rows, np.where(resident >= 0, resident + 1, 0)] = True
    hit = table[rows, np.where(valid, true_next + 1, 0)] & valid
    n = valid.sum(axis=1)
    return np.where(n > 0, hit.sum(axis=1) / np.maximum(n, 1), 1.0)


def cap_policy(cfg: SimConfig):
    """The run's ``FetchCapPolicy``: ``cfg.fetch_policy`` when set, else ``Fixed(fetch_ratio)`` (``Unlimited`` at
    ratio 1); retrieval always fetches its whole set (``Unlimited``)."""
    if modes.get(cfg.mode).on_demand:
        return Unlimited()
    if cfg.fetch_policy is not None:
        return get_policy(cfg.fetch_policy)
    if cfg.fetch_ratio >= 1.0:
        return Unlimited()
    return Fixed(cfg.fetch_ratio)


@dataclass(frozen=True)
class StepLink:
    """What the engine knows of the step being planned, for adaptive cap policies (``CapContext``'s runtime
    fields): the previous step's simulated duration (None before the first), the effective host->GPU rate, bytes
    of one block-head, and the requests decoding this step (the link is shared by all of them)."""

    last_step_time_s: float | None
    link_bytes_per_s: float
    bytes_per_block_head: int
    decode_requests: int


def _pred_of(mode: str, s: SyntheticStep):
    query = modes.get(mode).query
    if query == modes.QUERY_DRAFT:
        return s.draft
    if query == modes.QUERY_PREVIOUS:
        return s.proxy
    return s.true_next  # the current query's set (retrieval: fetched on demand)


class ReplaySets:
    """Recorded per-step sets standing in for the generator: a JSON object
    ``{"top_k": K, "n_blocks": N, "initial": [[...] x P], "steps": [{"true_next": [[...] x P],
    "draft": [...], "proxy": [...]}, ...]}`` (each set -1 padded to K). Steps beyond the recording repeat the last
    one (no drift)."""

    def __init__(self, path: str, top_k: int):
        try:
            with open(path, "rb") as f:
                obj = json.loads(f.read().decode("utf-8"))
        except OSError as e:
            raise ConfigError(f"replay_file: cannot read {path}: {e.strerror}") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"replay_file: {path} is not valid JSON: {' '.join(str(e).split())[:200]}") from None
        except RecursionError:
            raise ConfigError(f"replay_file: {path} is not valid JSON: nested too deeply") from None

        def arr(where, v):
            try:
                a = np.asarray(v, dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                raise ConfigError(
                    f"replay_file: {path}: {where}: must be an array of integer arrays, got {show(v, 40)}"
                ) from None
            if a.ndim != 2 or a.shape[1] != top_k:
                raise ConfigError(
                    f"replay_file: {path}: {where}: must have shape [rows, top_k={top_k}], got {list(a.shape)}"
                )
            return a

        if not isinstance(obj, dict) or "steps" not in obj or "initial" not in obj:
            raise ConfigError(f"replay_file: {path}: must be an object with 'initial' and 'steps'")
        self.initial = arr("initial", obj["initial"])
        self.steps = []
        for i, s in enumerate(obj["steps"]):
            if not isinstance(s, dict):
                raise ConfigError(f"replay_file: {path}: steps[{i}]: must be an object, got {str(s)[:40]}")
            got = {}
            for key in ("true_next", "draft", "proxy"):
                if key not in s:
                    raise ConfigError(f"replay_file: {path}: steps[{i}].{key}: missing required field")
                got[key] = arr(f"steps[{i}].{key}", s[key])
                if got[key].shape[0] != self.initial.shape[0]:
                    raise ConfigError(
                        f"replay_file: {path}: steps[{i}].{key}: must have "
                        f"{self.initial.shape[0]} rows, got {got[key].shape[0]}"
                    )
            self.steps.append(SyntheticStep(i, got["true_next"], got["draft"], got["proxy"]))
        if not self.steps:
            raise ConfigError(f"replay_file: {path}: steps: must hold at least 1 step, got 0")
        self.rows = self.initial.shape[0]


class _ReplayGen:
    def __init__(self, sets: ReplaySets):
        self.sets = sets
        self.t = 0

    def current(self):
        return self.sets.initial

    def step(self) -> SyntheticStep:
        s = self.sets.steps[min(self.t, len(self.sets.steps) - 1)]
        self.t += 1
        return s


class PolicyRunner:
    """Groups of rows stepped together through oasis_core: ``groups`` block counts, each group ``P × kv_heads``
    rows (P = ``policy_layers``). One group is one request (exact) or one context bucket (profile)."""

    def __init__(self, cfg: SimConfig, group_blocks, seed: int, replay: "ReplaySets | None" = None):
        self.mode, self.top_k = cfg.mode, cfg.top_k
        # a background mode's victim cache: recall is of the top_k slots attention reads, not of every slot
        self.victim = modes.get(cfg.mode).background and cfg.resident_slots > cfg.top_k
        self.kvh = cfg.model_spec.n_kv_heads
        self.P = cfg.policy_layers
        self.cap = cap_policy(cfg)
        self.max_cap = self.cap.max_cap(cfg.top_k)
        self.adaptive = not self.cap.static
        self.row_span = cfg.model_spec.n_full_layers * self.kvh  # rows of a request (full layers, all KV heads)
        self.nb = [max(int(n), 2) for n in group_blocks]
        if replay is not None:
            self.gen = _ReplayGen(replay)
            self.rows = replay.rows
            self.group_rows = replay.rows
        else:
            self.group_rows = self.P * self.kvh
            self.rows = self.group_rows * len(self.nb)
            nb = np.repeat(np.asarray(self.nb, dtype=np.int64), self.group_rows)
            self.gen = SyntheticSelection(
                self.rows, nb, cfg.top_k, cfg.synthetic_params, seed, layers=self.P, kv_heads=self.kvh
            )
        # The first fill: the first set into the row's slots (K, or a hot cache's hot_slots, whose others start empty)
        first = initial_plan(self.gen.current(), slots=cfg.resident_slots)
        self.resident, self.last_sel = first.resident, first.last_sel
        self.first_fetch = first.n_fetch
        self.ledgers = None
        self.handoff_units = None
        if cfg.split == "rpf" and replay is None:
            # Unit bytes are applied by the caller (1 here): the ledgers count (layer, head, block) units.
            self.ledgers = [RemoteLedger(self.P, self.kvh, n, 1) for n in self.nb]
            cur = self.gen.current().reshape(len(self.nb), self.P, self.kvh, -1)
            for g, led in enumerate(self.ledgers):
                led.handoff(cur[g], cfg.rpf_granularity)
            self.handoff_units = np.array([led.handoff_units for led in self.ledgers], dtype=float)
        self.i = 0
        self.record = False
        self.plans = []
        self.drift = np.zeros(self.rows, dtype=np.int64)  # cumulative missing blocks per row (adaptive policies)
        self.moved_bytes = 0.0
        # Policy state: the rows are layer-major over the P sampled layers (one request in 'exact'); a replay's rows
        # count as P layers when they divide evenly, else as one.
        self.layers = self.P if self.rows % self.P == 0 else 1
        rs, ls = self.cap.row_state_init(cfg.top_k), self.cap.layer_state_init(cfg.top_k)
        self.row_state = state_array(rs, self.rows) if rs else None
        self.layer_state = state_array(ls, self.layers) if ls else None

    def step(self, recall: bool = True, link: StepLink | None = None):
        """Per-row arrays (fetch, missing, recall) and per-group remote units per row (or None).
        ``recall=False`` skips the recall metric (returns None for it). ``link``: the engine's view of the step,
        passed to adaptive policies through ``CapContext`` (static policies never look at it)."""
        s = self.gen.step()
        self.i += 1
        pred = _pred_of(self.mode, s)
        if self.adaptive:
            # Each sampled row stands for (rows of a request / sampled rows) rows of each of the decoding requests.
            n_dec = link.decode_requests if link is not None else 1
            ctx = CapContext(
                step=self.i,
                top_k=self.top_k,
                rows=self.rows,
                drift_so_far=self.drift.copy(),
                n_missing=count_missing(self.resident, pred),
                bytes_moved_total=self.moved_bytes,
                last_step_time_s=link.last_step_time_s if link is not None else None,
                link_bytes_per_s=link.link_bytes_per_s if link is not None else None,
                bytes_per_block_head=link.bytes_per_block_head if link is not None else None,
                row_weight=max(n_dec, 1) * self.row_span / self.rows,
                n_predicted=(pred >= 0).sum(axis=1),
                layers=self.layers,
                row_state=self.row_state,
                layer_state=self.layer_state,
            )
            cap = self.cap.cap(ctx)
        else:
            cap = self.cap.cap(CapContext(step=self.i, top_k=self.top_k, rows=self.rows))
        plan = plan_step(self.resident, self.last_sel, pred, cap, self.i, self.max_cap)
        self.resident, self.last_sel = plan.resident, plan.last_sel
        if self.adaptive:
            self.drift += plan.n_missing
            if link is not None:
                self.moved_bytes += float(plan.n_fetch.sum()) * link.bytes_per_block_head
        if self.record:
            self.plans.append((s, plan))
        rec = None
        if recall:
            held = attended_blocks(plan.resident, plan.last_sel, self.top_k) if self.victim else plan.resident
            rec = resident_recall(held, s.true_next)
        remote = None
        if self.ledgers is not None:
            fb = plan.fetch_block.reshape(len(self.nb), self.P, self.kvh, -1)
            remote = (
                np.array([led.request(fb[g]).n_fetch.sum() for g, led in enumerate(self.ledgers)], dtype=float)
                / self.group_rows
            )
        return plan.n_fetch, plan.n_missing, rec, remote


class Episode:
    """One request's sampled rows, stepped once per decode step (``policy_sampling='exact'``)."""

    def __init__(self, cfg: SimConfig, n_blocks: int, seed: int, replay: ReplaySets | None = None):
        self.runner = PolicyRunner(cfg, [n_blocks], seed, replay)
        self.initial_fetch = float(self.runner.first_fetch.mean())
        self.handoff_units = (
            float(self.runner.handoff_units[0] / self.runner.group_rows)
            if self.runner.handoff_units is not None
            else 0.0
        )

    def step(self, link: StepLink | None = None) -> tuple[float, float, float, float]:
        f, m, r, rem = self.runner.step(link=link)
        return float(f.mean()), float(m.mean()), float(r.mean()), (float(rem[0]) if rem is not None else 0.0)


@dataclass
class Profile:
    """Per-row figures by decode step of one context bucket; index 0 is the first fill.

    ``fetch``/``missing``/``recall`` cover the calibration episode (``profile_steps``); beyond it a step reuses
    ``tail`` (the mean of the episode's second half). ``remote`` (RPF units per row fetched over the network) is
    *not* extrapolated that way: a unit crosses the network at most once (the ledger), so its per-step mean decays
    to zero and reusing it would invent traffic. The bank steps the episode's ledger over the workload's whole
    decode length instead, so ``remote`` may be longer than ``fetch``; beyond it a step fetches nothing remotely.
    """

    fetch: np.ndarray  # [N + 1]
    missing: np.ndarray  # [N + 1]
    recall: np.ndarray  # [N + 1] (recall[0] = 1: the first fill is exact)
    remote: np.ndarray  # [M + 1], M >= N: RPF units per row fetched over the network (remote[0] = hand-off)
    tail: tuple  # (fetch, missing, recall, 0.0): steps beyond the episode

    def __post_init__(self):
        self.n_fit = len(self.fetch)
        tf, tm, tr = self.tail[:3]
        self.tail = (tf, tm, tr, 0.0)
        rem = [float(x) for x in self.remote]
        # Python floats per step, so the engine's hot loop indexes a list instead of four arrays.
        self.rows = [
            tuple(float(a[i]) for a in (self.fetch, self.missing, self.recall)) + (rem[i],) for i in range(self.n_fit)
        ]
        self.rows += [(tf, tm, tr, rem[i]) for i in range(self.n_fit, len(rem))]
        self.n = len(self.rows)

    def at(self, i: int) -> tuple:
        return self.rows[i] if i < self.n else self.tail

    def set_slices(self, layers: int, kv_heads: int) -> None:
        """``slice_rows`` / ``slice_tail``: ``rows`` / ``tail`` with the fetch as a request's (block, head) slices,
        ``fetch * layers * kv_heads`` (the engine's product, in its order), for the engine's hot loop."""
        self.slice_rows = [(f * layers * kv_heads, m, r, rem) for f, m, r, rem in self.rows]
        f, m, r, rem = self.tail
        self.slice_tail = (f * layers * kv_heads, m, r, rem)


def bucket_of(n_blocks: int) -> int:
    """Quarter-octave bucket representative of a block count (>= 2)."""
    n = max(int(n_blocks), 2)
    return max(2, int(round(2 ** (round(math.log2(n) * 4) / 4))))


def victim_profile_steps(cfg: SimConfig, cap: int, max_steps: int | None) -> int:
    """A victim cache's episode: ``profile_steps``, and at least four fills of its extra slots at the cap (no more
    than the workload's longest decode needs). Its fetches stay at the cap until the near-miss blocks are resident
    (the bench's 16K, K 128, S 3K: ~40 steps at fetch ratio 0.05, ~70 at 0.02), so the tail, the second half, is
    the steady state only after about two fills; a 64-step episode's tail overstated it up to ~1.1x at fetch ratio
    0.05 and 5x at 0.02 (the Mooncake trace's host->GPU bytes +8.6% and +39%)."""
    fill = -(-(cfg.resident_slots - cfg.top_k) // max(cap, 1))
    want = 4 * fill if max_steps is None else min(4 * fill, max_steps + 1)
    return min(max(cfg.profile_steps, want), MAX_PROFILE_STEPS)


class ProfileBank:
    """Profiles for every context bucket the workload needs, computed together in one vectorised runner."""

    def __init__(self, cfg: SimConfig, block_counts, seed: int, max_steps: int | None = None):
        """``max_steps``: the longest decode (output tokens) of the workload; with ``split='rpf'`` the episode's
        ledger is stepped that far (remote units only) so that no step's misses are extrapolated."""
        buckets = sorted({bucket_of(n) for n in block_counts})
        self.profiles: dict[int, Profile] = {}
        if not buckets:
            return
        reps = cfg.profile_replicas
        # each bucket's rows: ``reps`` requests of the bucket's blocks, one after the other, averaged
        run = PolicyRunner(cfg, [b for b in buckets for _ in range(reps)], seed)
        n = victim_profile_steps(cfg, run.max_cap, max_steps) if run.victim else cfg.profile_steps
        g, gr = len(buckets), run.group_rows * reps
        fetch = np.zeros((n + 1, g))
        missing = np.zeros((n + 1, g))
        recall = np.ones((n + 1, g))
        remote = np.zeros((n + 1, g))
        fetch[0] = run.first_fetch.reshape(g, gr).mean(1)
        if run.handoff_units is not None:
            remote[0] = run.handoff_units.reshape(g, reps).mean(1) / run.group_rows
        for i in range(1, n + 1):
            f, m, r, rem = run.step()
            fetch[i], missing[i], recall[i] = (a.reshape(g, gr).mean(1) for a in (f, m, r))
            if rem is not None:
                remote[i] = rem.reshape(g, reps).mean(1)
        if run.ledgers is not None and max_steps is not None and max_steps > n:
            ext = np.zeros((max_steps - n, g))
            for i in range(max_steps - n):
                ext[i] = run.step(recall=False)[3].reshape(g, reps).mean(1)
            remote = np.concatenate([remote, ext])
        half = 1 + n // 2
        for j, b in enumerate(buckets):
            cols = (fetch[:, j], missing[:, j], recall[:, j])
            self.profiles[b] = Profile(*cols, remote[:, j], tail=tuple(float(c[half:].mean()) for c in cols))

    def get(self, n_blocks: int) -> Profile:
        return self.profiles[bucket_of(n_blocks)]


class RequestPolicy:
    """Per-request handle the engine steps: ``first_fill()`` then ``next()`` once per decode step."""

    __slots__ = ("profile", "episode", "i", "rscale")

    def __init__(self, profile: Profile | None = None, episode: Episode | None = None, rscale: float = 1.0):
        self.profile, self.episode, self.i = profile, episode, 0
        # Profile: decode-time remote units scale with the request's blocks over its bucket's (the synthetic
        # near-miss window, hence the never-sent blocks a row drifts into, is a fixed share of the context).
        self.rscale = rscale

    def first_fill(self) -> float:
        """(block, head) slices per row fetched at admission."""
        return float(self.profile.fetch[0]) if self.episode is None else self.episode.initial_fetch

    def handoff_units(self) -> float:
        """RPF: units per row sent at hand-off (predicted union + local block)."""
        return float(self.profile.remote[0]) if self.episode is None else self.episode.handoff_units

    def next(self, link: StepLink | None = None) -> tuple:
        """(fetched, missing, recall, remote units) per row for the next decode step (``link``: see ``StepLink``,
        read by adaptive cap policies in exact episodes only)."""
        self.i += 1
        if self.episode is not None:
            return self.episode.step(link)
        f, m, r, rem = self.profile.at(self.i)
        return f, m, r, rem * self.rscale


class PolicySource:
    """Hands out a :class:`RequestPolicy` per admitted request according to the config."""

    def __init__(self, cfg: SimConfig, block_counts, max_steps: int | None = None):
        self.cfg = cfg
        self.replay = ReplaySets(cfg.replay_file, cfg.top_k) if cfg.selection == "replay" else None
        self.bank = None
        if cfg.sparse and cfg.policy_sampling == "profile" and self.replay is None:
            self.bank = ProfileBank(cfg, block_counts, cfg.seed, max_steps)

    def for_request(self, req_id: int, n_blocks: int) -> RequestPolicy | None:
        if not self.cfg.sparse:
            return None
        if self.bank is not None:
            return RequestPolicy(profile=self.bank.get(n_blocks), rscale=max(int(n_blocks), 2) / bucket_of(n_blocks))
        # Exact: one episode per request, seeded by (seed, request id) so the order of admission does not matter.
        seed = (self.cfg.seed * 1_000_003 + int(req_id) * 7919) % (2**63)
        return RequestPolicy(episode=Episode(self.cfg, n_blocks, seed, self.replay))
