"""The decode node's engine: a SimPy process looping ``schedule → execute → update``.

The loop is the one scheduler's step (``oasis_core.scheduler``): ``plan = sched.schedule(now)``, ``execute(plan)``
advances simulated time to the step's end, ``sched.update(plan, end)``.

``execute`` turns a :class:`~oasis_core.scheduler.Plan` into a :class:`~oasis_sim.pipeline.LayerWork` (per-layer
compute, background prediction/selection, transfer bytes per layer, all from the predictor and the copy path),
asks the policy handle of every decode request for its blocks of this step (``oasis_sim.policy`` → oasis_core), then
times the step with the closed-form pipeline and yields one SimPy event at the step's end (or, with
``event_mode='events'``, runs the step as per-layer SimPy processes).

Short contexts (``SimConfig.short_context_rule``, ``oasis_core.short_context``): in a sparse mode, a decode request
whose context fits its resident set runs as in ``dense`` (its tokens attended in place; no draft row, summary
scoring, top-K, selection or transfer; no first fill after its prefill, whose KV is not offloaded to the host). At
the step it outgrows the set, its KV so far is copied GPU->host once on the d2h path (``d2h_bytes``), and that step
lasts at least the copy (the blocks must be on the host before the next step may evict them); it is a sparse step
from then on.

An fp8 host copy (``SimConfig.host_kv_dtype="fp8_e4m3"``): every host->GPU fetch and GPU->host offload moves the
host copy's bytes (``KVGeometry.host_bytes_per_block_head``: half of bf16's, plus two 4-byte scales), so the copy
times follow; the GPU's attention and summary reads keep the KV dtype (the executor dequantizes in the copy).

Speculative decoding (``SimConfig.speculative_k``, modes ``dense`` and ``lookahead``; the executor's
``oasis_exec.runner.speculative``): a decode step in which no request is short or crossing drafts ``k_r`` tokens for
request ``r`` (fixed: ``speculative_k``, the batch's least ``max_tokens - generated - 1`` bounding it; ``auto``:
``oasis_core.speculation.AdaptiveK`` per request, as the executor) and verifies ``K = max k_r`` for all (a
request's drafts past its own ``k_r`` count as rejected, as the executor's pass). It costs the draft head's steps over the batch (the
predictor's ``draft_step``, or ``speculative_gamma`` times the verify pass, each) that a step without speculation
does not run: ``K`` in ``dense``, ``K - 1`` in ``lookahead`` (the executor's head runs K - 1 chain steps and the
proposal after the acceptance, and a lookahead step without speculation makes that proposal too), on the compute
stream before the layers, plus the verify pass: every layer's GEMMs, norms and the LM head
over ``K + 1`` tokens a decode request, and its attention reading the request's KV once per position in ``dense``
(``K + 1`` times: the paged kernel attends each position as a query row of its own) and once in ``lookahead`` (the
sparse kernel attends a row's positions together: 2.80 ms of sparse attention a step at k = 2 against 3.39 at
k = 0 in the H200 profile, ``experiments/speculative_decoding/results/profile_spec_2610b77``); no draft row in
``lookahead`` (the pass's positions hold the next step's query). It emits ``1 + n_r`` tokens, ``n_r`` drawn per
request and step by ``oasis_core.speculation.ChainAcceptance`` (``speculative_alpha``, or ``speculative_accepted_hist``'s
per-position rates). Selection and transfers stay once a step (the next step's set), so per emitted token they
happen ``1 / (1 + n)`` times as often; TPOT (per request: time / tokens) follows. In ``lookahead`` they run after
the pass, as the executor's speculative step runs them (its prediction needs the step's acceptance; measured on the
H200, experiments/speculative_decoding/README.md): every layer's prediction and selection, then its copy, the
prediction one layer ahead of the copy, none beside the pass's compute; each layer's prediction waits for that
layer's commit of the accepted drafts (op ``spec_commit``, on the compute stream after the acceptance, in
``beside`` too: ``oasis_sim.spec_pipeline``).

Hybrid models (``ModelSpec.layer_windows``, ``oasis_sim.layer_kinds``): only the full-attention layers have the
sparse machinery. Rows, fetches, first fills, remote units and transfers count the full layers (``Lf`` of them),
each full layer's transfer carrying ``1 / Lf`` of the step's bytes; prediction, selection, the side stream's HBM
traffic, the sparse overhead and the uva gather's SM share sit on the full layers alone. A windowed layer of window
W runs the step's GEMMs (the draft row included: the draft token's query must pass it to reach the next full layer)
and attends ``min(ctx, W)`` tokens of every decode request densely (``K + 1`` reads in a speculative step), its
prefill attention over the window; no side work, no transfer. The step then has per-layer durations (lists in
``LayerWork``); a model without windows keeps the scalars, float for float.

Decode chains (``SimConfig.decode_chain``, the executor's): in a step where every running request decodes, none waits
and none is short or crossing, the predictor's ``step_overhead`` is asked with ``chain`` = the chain's length (the
calibrated predictor pays the host's round trip once a chain; the roofline ignores it); speculative steps likewise
with ``SimConfig.spec_chain`` (``spec_chain_max``: fixed k, ``spec_predict`` after). A ``step_floor`` (vLLM's
host loop, calibrated predictor) is the least a step lasts.

Fast-forward (``SimConfig.fast_forward``, closed form only). A whole-KV mode (``dense``) without windows takes
``oasis_sim.stretch.WholeKVStretch``: the scheduled plan's step and the steps after it, prefill chunks, requests
joining and ending included, priced from the batch's totals and applied once (exact but for float rounding; its
docstring says when it stops). Every other mode (sparse, hybrid models): after a step in which every running request
decoded (no
prefill, admission or preemption, no speculation, no stall, the pipeline on its steady fast path, every sparse
request on its policy profile's steady tail), the next ``k`` steps are taken at once with that step's duration: ``k``
at most ``fast_forward`` and any request's remaining tokens (a request whose last token the stretch's last step
emits ends at its end, as ``Scheduler.update`` ends it, the others' holdings as the exact steps' meanwhile), the
stretch's last step starting before the next event in the queue (an arrival, a hand-off) or the waiting head's ready
time, and only when the pools can give the stretch's memory growth (so no preemption can fall inside it). Behind a
waiting head that this step could not admit (split none, no prefix cache) arrivals only join the queue: they do not
end a stretch. A short-context request (resident-dense in a sparse mode) is read as in dense, and the stretch ends
before its offload step. Each request emits ``k`` tokens and reads its profile's tail ``k`` times; the step log gets
``k`` rows. A step's duration grows by the attention of one more token of every request whose attended KV grows
(all of them with the whole KV on the GPU); in a hybrid model per layer kind, exactly: a windowed layer's stops
growing once the context reaches its window, a full layer's at the resident set (``_hybrid_growth``), and a
request's fetches count the full layers' rows. What it leaves out: a sparse step's summaries and top-K grow with the
blocks crossed inside a stretch (measured: ``experiments/simulator_calibration``; the fast-vs-exact test is
``tests/unit/test_sim_fast_forward.py``).

Steady requests (the profile sampling, no speculation, no remote fetch): a request whose step read its profile's
tail, past its short context and the resident set, adds the same figures at every later step (fetched slices,
recall, the tail's row); ``execute`` then only sums them into the step's totals, in the batch's order, and
``_settle`` adds them to the request, one step at a time as the loop would, when it leaves the batch (ends, is
preempted) or before a fast-forward: the same floats (``tests/unit/test_sim_steady.py``: every output file).

Per step the engine records (``StepLog``): start, duration, decode and prefill tokens, host→GPU bytes, stall (and,
not in ``steps.csv``, the tokens the decodes emitted).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from itertools import accumulate

import simpy

from oasis_core import modes
from oasis_core.block_scorers import read_fraction
from oasis_core.geometry import KVGeometry
from oasis_core.scheduler import DECODE, Plan
from oasis_core.speculation import AdaptiveK, ChainAcceptance

from . import spec_pipeline
from .config import SimConfig
from .hardware import GPU
from .layer_kinds import LayerKinds
from .pipeline import LayerPipeline, LayerWork, StepTiming, at
from .policy import StepLink, cap_policy
from .predictor import TimePredictor
from .scheduler import SimScheduler
from .stretch import WholeKVStretch
from .stretch import applies as stretch_applies

SPEC_SALT = 0xACCE97  # the acceptance draws: a stream of their own (the executor's ACCEPT_SALT)


@dataclass
class StepLog:
    t: list = field(default_factory=list)  # step start, s
    dur: list = field(default_factory=list)  # s
    decode: list = field(default_factory=list)  # requests decoding
    prefill: list = field(default_factory=list)  # prefill tokens
    h2d: list = field(default_factory=list)  # host->GPU bytes planned this step
    net: list = field(default_factory=list)  # NIC bytes fetched remotely this step (split=rpf)
    stall: list = field(default_factory=list)  # s
    emitted: list = field(default_factory=list)  # output tokens the step's decodes emitted (n_dec without speculation)


def _capped_growth(rooms, k: int) -> list:
    """``[sum(min(j, room) for room in rooms if room > 0) for j in 1..k]`` in O(len(rooms) + k); ``None``: no cap."""
    at_room = [0] * (k + 1)  # requests whose room is j (< k)
    open_n = 0  # requests still growing at the step
    for d in rooms:
        if d is None or d >= k:
            open_n += 1
        elif d > 0:
            at_room[d] += 1
            open_n += 1
    out, capped = [], 0
    for j in range(1, k + 1):
        out.append(capped + j * open_n)
        capped += j * at_room[j] if j < k else 0  # those whose room is j stop growing after step j
        open_n -= at_room[j] if j < k else 0
    return out


class SimEngine:
    def __init__(
        self,
        env: simpy.Environment,
        cfg: SimConfig,
        geo: KVGeometry,
        gpu: GPU,
        sched: SimScheduler,
        predictor: TimePredictor,
        h2d_Bps: float,
        h2d_latency_s: float,
        timeline=None,
        remote=None,
    ):
        self.env, self.cfg, self.geo, self.gpu, self.sched, self.pred = env, cfg, geo, gpu, sched, predictor
        m = geo.model
        self.L = m.n_layers
        self.kinds = LayerKinds(m)
        self.Lf = self.kinds.n_full  # layers with a sparse working set: all L without windows
        self.kvh = m.n_kv_heads
        self.h2d_Bps = h2d_Bps
        self.h2d_lat = h2d_latency_s
        self.pipe = LayerPipeline(self.L)
        self.log = StepLog()
        self.timeline = timeline
        self.remote = remote  # split.RemoteFetcher for split=rpf, else None
        self.steps = 0
        self.h2d_bytes = 0.0
        self.d2h_bytes = 0.0
        self.prefix_copy_bytes = 0.0  # prefix-cache host-tier hits copied host->GPU (counted in h2d_bytes)
        self.stall_s = 0.0
        self.recall_sum = 0.0
        self.recall_n = 0
        self.miss_sum = 0.0  # per-row predicted blocks not on the GPU, summed over (request, decode step) that select
        self.sel_n = 0  # those (request, decode step)s: a hot cache's hit rate is 1 - miss_sum / (sel_n * top_k)
        self.pending_fill = 0.0  # (block, head) slices of first fills planned in the previous step
        self._d2h_free = 0.0
        self.wake = env.event()  # succeeded when work may have arrived while idle
        self.bpbh = geo.bytes_per_block_head  # the KV dtype's: the NIC hand-off (split), the GPU's own reads
        # what crosses host->GPU per fetched (block, head) and GPU->host per offloaded token: the host copy's bytes
        # (SimConfig.host_kv_dtype; fp8_e4m3 halves them, plus the scales)
        self.host_bpbh = geo.host_bytes_per_block_head(cfg.host_kv_dtype)
        self.host_bpt = geo.host_bytes_per_token(cfg.host_kv_dtype)
        self.bpt_layer = geo.bytes_per_token_layer
        self.sum_bpbh = geo.summary_bytes_per_block_head
        # what the scoring reads of them: the vectors the block scorer uses (oasis_core.block_scorers)
        self.score_bpbh = self.sum_bpbh * read_fraction(cfg.block_score)
        self.res_tokens = (cfg.top_k + 1) * cfg.block_size
        self.short = cfg.short_context_rule  # None: no request runs resident-dense
        self.short_window = self.short.window_tokens if self.short is not None else 0
        self._events_out: list[StepTiming] = []
        self._memo = bool(getattr(type(predictor), "memoisable", False))
        self._tok_cache: dict = {}
        self._lm_cache: dict = {}
        self._head_cache: dict = {}  # decode chain length -> step_overhead (memoisable predictors)
        self._floor_cache: dict = {}  # decode requests -> step_floor
        self._time1_cache: dict = {}  # (operation, its one input's value) -> predicted time (memoisable predictors)
        # Steady requests (execute's plain loop): on their profile's tail, beyond the short context and the resident
        # set, every step adds the same figures to a request; they are added when it leaves the batch (_settle)
        self._steady: dict = {}  # id -> request
        self._plain_steps = 0  # steps through the plain loop
        self._sparse = cfg.sparse
        self.ff_max = cfg.fast_forward if cfg.event_mode == "closed" and not cfg.spec_max_k else 0
        # the only events besides the engine's are arrivals that just join the queue (no prefill node, no prefix
        # cache copying a hit in at arrival): behind a blocked head they cannot end a stretch
        self._quiet_arrivals = cfg.split == "none" and not cfg.prefix_cache
        self.ff_steps = 0  # steps taken by the fast-forward
        self.stretch = WholeKVStretch(self) if self.ff_max and stretch_applies(cfg, m) else None
        bank = sched.policy_source.bank if sched.policy_source is not None else None
        self._slices = bank is not None and not cfg.spec_max_k and remote is None
        self._lazy_ok = self._slices and sched.decode_with_prefill  # (a steady request decodes at every step)
        if self._slices:  # the profiles' fetches as slices (Profile.set_slices), for execute's plain loop
            for prof in bank.profiles.values():
                prof.set_slices(self.Lf, self.kvh)
        self._last_work = self._prev_work = None
        self._last_gpu_floor = (0.0, 0.0)
        self._ff_periodic = False
        self.chain_max = min(cfg.decode_chain, cfg.block_size)
        self.spec_chain_max = cfg.spec_chain_max  # chained speculative steps (SimConfig.spec_chain; 1: off)
        # Adaptive cap policies (exact episodes) get the step's link view; static ones never look at it.
        self._adaptive = cfg.sparse and not cap_policy(cfg).static
        # Speculative decoding (module docstring): off with speculative_k = 0, every step then as before
        self.spec_k = cfg.spec_max_k
        self.spec_policy = None
        self.emitted = {}  # request id -> tokens the last step emitted for it (absent: one)
        if self.spec_k:
            if cfg.spec_adaptive:
                self.spec_policy = AdaptiveK(self.spec_k, cfg.speculative_gamma)
            hist = cfg.speculative_accepted_hist
            self.spec_accept = (
                ChainAcceptance.from_hist(hist) if hist is not None else ChainAcceptance.constant(cfg.speculative_alpha)
            )
            self.spec_random = random.Random(cfg.seed * 1_000_003 + SPEC_SALT).random
            self.spec_steps = 0  # speculative steps, the decode request-steps in them and their emitted tokens
            self.spec_req_steps = 0
            self.spec_tokens = 0
            self.spec_accepts = Counter()  # (drafts, accepted) -> request-steps
            self.spec_drawn = None  # the step's accepted drafts a decode request, drawn before it is timed
            self.spec_repairs = 0  # spec_predict beside: request-steps whose acceptance needed a repair
            self._s_hat = {}  # draft length -> the beside prediction's query index (oasis_sim.spec_pipeline)
            self._repair_on = True  # the step launches its repair (some request's acceptance can move its prediction)

    def notify(self) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    # -- the loop -------------------------------------------------------------------------------------------------
    def run(self, more_work):
        """SimPy process: step while there is work; ``more_work()`` says whether requests may still come."""
        env, sched = self.env, self.sched
        while True:
            plan = sched.schedule(env.now)
            if plan.empty:
                if not more_work() and not sched.waiting and not sched.running:
                    for r in list(self._steady.values()):
                        self._settle(r)
                    return
                nxt = self.next_ready_time()
                self.wake = env.event()
                if nxt is not None and nxt > env.now:
                    yield env.any_of([self.wake, at(env, nxt)])
                else:
                    yield self.wake
                continue
            if self.stretch is not None:  # a whole-KV mode: the plan's step and those after it (oasis_sim.stretch)
                k = yield from self.stretch.run(plan)
                if k:
                    continue
            timing = yield from self.execute(plan)
            done = sched.update(plan, timing.end, emitted=self.emitted)
            if self._steady:
                for r in done:
                    if r.steady is not None:
                        self._settle(r)
            if self.spec_policy is not None:
                for r in done:
                    self.spec_policy.drop(r.id)
            elif self.ff_max and not done and self.stretch is None:
                k = self._ff_steps(plan, timing)
                if k:
                    yield from self._fast_forward(plan, k, timing)

    # -- fast-forward (SimConfig.fast_forward) -------------------------------------------------------------------
    def _ff_steps(self, plan: Plan, timing) -> int:
        """How many more steps exactly like ``plan``'s the engine may take at once: 0 unless every running request
        decoded in it (no prefill, no admission or preemption, no speculation, no short context, no stall, the
        pipeline in its steady fast path), every sparse request reads its policy's steady tail, and then the fewest
        of: ``ff_max``, the steps before any request's last token, before the next event in the queue (an arrival, a
        prefill-node hand-off) or the waiting head's ready time, and those whose memory growth the pools can give
        without a preemption. A waiting head that this step's schedule tried and could not admit stays blocked
        through the stretch (memory only shrinks while no request finishes); one that came during the step ends it."""
        sched, env = self.sched, self.env
        n = len(plan.decode)
        if not n or plan.prefill or plan.admitted or plan.preempted or len(sched.running) != n:
            return 0
        head = sched.waiting[0] if sched.waiting else None  # blocked: no memory frees in a stretch (none finishes)
        if timing.stall_s or self.remote is not None or self._adaptive or not self._memo:
            return 0
        periodic = False  # the pipeline's loop path in a steady period: this step as long as the one before
        if modes.get(self.cfg.mode).background and self.pipe._lazy is None:
            d = self.log.dur
            if len(d) < 2 or abs(d[-1] - d[-2]) > 1e-12 * d[-1] or self._prev_work != self._last_work:
                return 0  # not steady: a copy or the side stream still carries over a changing backlog
            if any(r.prompt_len + r.generated < self.res_tokens for r in plan.decode):
                return 0  # attention still grows: the period would not hold
            periodic = True
        if self.timeline is not None and self.steps < self.cfg.timeline_steps:
            return 0
        dur = timing.end - timing.start
        if dur <= 0:
            return 0
        k = self.ff_max
        nxt = env.peek()
        if head is not None:
            if timing.start < head.ready_t <= env.now:
                return 0  # it came during this step: the next schedule may admit it
            if head.ready_t > env.now:
                nxt = min(nxt, head.ready_t)
            elif self._quiet_arrivals:  # blocked: an arrival queues behind it and changes nothing in the stretch
                nxt = float("inf")
        self._ff_until = nxt  # the stretch's last step starts before it (_fast_forward cuts k exactly)
        if nxt != float("inf"):
            k = min(k, int((nxt - env.now) / dur) + 1)  # k - 1 steps, each at least dur long, start before nxt
        short, bs = self.short, self.cfg.block_size
        acct = sched.acct
        for r in plan.decode:
            if r.state != DECODE:
                return 0
            k = min(k, r.max_tokens - r.generated)  # its finishing step may close the stretch
            if k <= 0:
                return 0
            ctx = r.prompt_len + r.generated
            if short is not None and ctx <= short.window_tokens + 1:
                # resident-dense: the stretch ends before its offload step (ctx == window + 1), run as an ordinary one
                k = min(k, short.window_tokens + 1 - ctx)
                if k <= 0:
                    return 0
            else:
                pol = r.policy
                if pol is not None and (pol.profile is None or pol.i < pol.profile.n):
                    return 0  # this step did not read the profile's steady tail
        # the most steps whose memory growth the pools can give (halved until it fits): a step that cannot grow
        # preempts, so the stretch ends before it
        ctxs = [(r, r.ctx) for r in plan.decode]
        free_gpu, free_host = self.gpu.hbm.free, acct.host.free
        while k > 0:
            grow_gpu = grow_host = 0.0
            for r, ctx in ctxs:
                if -(-(ctx + k) // bs) != -(-ctx // bs):
                    gpu, host = acct.need(r, ctx + k, staging=False)
                    grow_gpu += gpu - r.gpu_held
                    grow_host += host - r.host_held
            if not (grow_gpu > 0 and grow_gpu > free_gpu or grow_host > 0 and grow_host > free_host):
                break
            k //= 2
        self._ff_periodic = periodic
        return max(k, 0)

    def _fast_forward(self, plan: Plan, k: int, timing):
        """Advance ``k`` steps of ``plan``'s duration at once (the module docstring's fast-forward): each request
        emits ``k`` tokens, its policy tail is read ``k`` times, the step log gets ``k`` rows, memory grows once."""
        for r in list(self._steady.values()):  # their figures first, in the order the steps added them
            self._settle(r)
        cfg, sched = self.cfg, self.sched
        L, kvh = self.L, self.kvh
        lg = self.log
        t0 = self.env.now
        h2d = lg.h2d[-1]
        n = len(plan.decode)
        fetch = recall = miss = 0.0
        nsel = 0
        # each step attends one more token of every request whose attended KV still grows (all of them with the
        # whole KV on the GPU; below the resident set otherwise): the duration grows by `grow` a step (attn_decode is
        # linear in its bytes at a given batch for every predictor here)
        whole = modes.get(cfg.mode).whole_kv_on_gpu
        gpu, floor = self._last_gpu_floor
        if self.kinds.hybrid:
            durs = [max(gpu + g, floor) for g in self._hybrid_growth(plan, k, whole)]
        else:
            m = n if whole else sum(1 for r in plan.decode if r.prompt_len + r.generated < self.res_tokens)
            grow = L * self.pred.time("attn_decode", {"kv_bytes": m * self.bpt_layer, "requests": n}) if m else 0.0
            durs = [max(gpu + (i + 1) * grow, floor) for i in range(k)]
        ts = list(accumulate(durs[:-1], initial=t0))
        if ts[-1] >= self._ff_until:  # an event (arrival, ready head) before the last step's start: end sooner
            k = sum(1 for t in ts if t < self._ff_until)
            if not k:
                return
            del durs[k:], ts[k:]
        w = self.short_window if self.short is not None else -1
        Lf = self.Lf
        for r in plan.decode:
            pol = r.policy
            if pol is not None and pol.profile is not None and not whole and r.prompt_len + r.generated > w:
                f, m, rec, _rem = pol.profile.tail
                pol.i += k
                r.fetch_blocks += k * f * Lf * kvh  # the full layers' rows, as execute counts them
                r.recall_sum += k * rec
                fetch += f
                recall += rec
                miss += m
                nsel += 1
            else:
                r.recall_sum += k
                recall += 1.0
            r.recall_n += k
            r.generated += k
        self.recall_sum += k * recall
        self.recall_n += k * n
        self.miss_sum += k * miss
        self.sel_n += k * nsel
        self.h2d_bytes += k * h2d
        self.steps += k
        self.ff_steps += k
        sched.step += k
        lg.t.extend(ts)
        lg.dur.extend(durs)
        lg.decode.extend([n] * k)
        lg.emitted.extend([n] * k)
        lg.prefill.extend([0] * k)
        lg.h2d.extend([h2d] * k)
        lg.net.extend([0.0] * k)
        lg.stall.extend([0.0] * k)
        if self._ff_periodic:  # the loop path's state, k periods later (every step as long: grow is 0 here)
            shift = sum(durs)
            pipe = self.pipe
            pipe._ready = [x + shift for x in pipe.ready]
            pipe.side_free += shift
            pipe.link_free += shift
        elif self._last_work is not None:  # the pipeline's state after the last of the k steps
            self.pipe.step_closed(ts[-1], self._last_work)
        end = ts[-1] + durs[-1]
        yield at(self.env, end)
        # as Scheduler.update at the last step's end: those that emitted their last token end, then the rest grow;
        # before, every request holds what it held after the step before it (the pools' peaks)
        done = [r for r in plan.decode if r.generated >= r.max_tokens]
        if done:
            sched.grow_fitting([(r, r.ctx - 1) for r in plan.decode])  # every one, as after the step before
            for r in done:
                sched.finish(r, end)
        sched.grow_fitting([(r, r.ctx) for r in plan.decode if r.state == DECODE])  # fits (_ff_steps)

    def _hybrid_growth(self, plan: Plan, k: int, whole: bool) -> list:
        """A hybrid model's stretch: for each of its ``k`` steps, how much longer than the step just run its layers'
        decode attention takes. Step ``j`` attends ``j`` more tokens of a request's context ``c`` (the step run's),
        capped per layer kind: a full layer reads ``min(c + j, resident tokens)`` (the whole context with the KV on
        the GPU), a layer of window ``W`` reads ``min(c + j, W)``: growth ``min(j, cap - c)``, none once ``c`` reaches
        the cap (``attn_decode`` is linear in its bytes at a given batch)."""
        ctxs = [r.prompt_len + r.generated - 1 for r in plan.decode]
        full_cap = None if whole else self.res_tokens
        caps = [(self.Lf, full_cap)] + [(self.kinds.count[w], w) for w in self.kinds.distinct]
        out = [0.0] * k
        attn, bpt, n = self.pred.time, self.bpt_layer, len(ctxs)
        for layers, cap in caps:
            tokens = _capped_growth([None if cap is None else cap - c for c in ctxs], k)
            for j, t in enumerate(tokens):
                if t:
                    out[j] += layers * attn("attn_decode", {"kv_bytes": t * bpt, "requests": n})
        return out

    def next_ready_time(self):
        w = self.sched.waiting
        if w and w[0].ready_t > self.env.now:
            return w[0].ready_t
        return None

    # -- execute: the step's timing ---------------------------------------------------------------------------
    def _per_token(self, tokens: int) -> float:
        """gemm_layer + norm_rope (+ tensor parallelism's two all-reduces) for a token count; memoised when the
        predictor says its times depend only on the shape (``memoisable`` class attribute), otherwise asked every
        step (e.g. a recording tap)."""
        v = self._tok_cache.get(tokens) if self._memo else None
        if v is None:
            pred = self.pred
            v = pred.time("gemm_layer", {"tokens": tokens}) + pred.time("norm_rope", {"tokens": tokens})
            tp = self.cfg.tensor_parallel
            if tp > 1:  # attention's and the MLP's partial outputs summed over the ranks: [tokens, hidden] each
                ar = {"bytes": tokens * self.geo.model.hidden * self.geo.model.dtype_bytes, "ranks": tp}
                v += 2 * pred.time("all_reduce", ar)
            if self._memo:
                self._tok_cache[tokens] = v
        return v

    def execute(self, plan: Plan):
        cfg, pred, L, Lf, kvh = self.cfg, self.pred, self.L, self.Lf, self.kvh
        kinds = self.kinds
        mode = modes.get(cfg.mode)
        short = self.short
        n_dec = len(plan.decode)
        n_pf = 0
        pf_attn = 0.0
        for ch in plan.prefill:
            r, n = ch.req, ch.n
            pf_attn += pred.time("attn_prefill", {"tokens": n, "past_tokens": r.prefill_done})
            n_pf += n
        win_attn = self._window_prefill(plan) if kinds.hybrid else None  # W -> a windowed layer's attention
        n_dense = 0  # decode requests running resident-dense in a sparse mode
        n_cross = 0  # of them, at their offload step (ShortContext.crossing: ctx == window + 1)
        w = self.short_window if short is not None else -1  # (-1: no request is short)
        per_request = mode.whole_kv_on_gpu or not n_dec  # the loop below: per request (else: selection, fetches)
        if short is not None and (per_request or self.spec_k):  # (else counted in the selection loop)
            for r in plan.decode:
                ctx = r.prompt_len + r.generated
                if ctx <= w:  # ShortContext.dense, inlined (the hot loop)
                    n_dense += 1
                elif ctx == w + 1:
                    n_cross += 1
        ks = self._spec_ks(plan, n_dense) if self.spec_k else None  # drafts per decode request, or None
        K = max(ks) if ks else 0
        beside = bool(K) and cfg.spec_predict == "beside" and mode.background  # oasis_sim.spec_pipeline
        repair_ids = self._spec_draw(plan, ks, K, beside) if K else ()
        repair_slices = 0.0

        # Decode attention, selection work and transfers.
        fetch_slices = 0.0  # (block, head) slices over all layers planned this step for the next
        inline_slices = 0.0
        recall_sum = 0.0
        remote_units = 0.0
        rpf = self.remote is not None
        ctx_tokens = 0
        att_tokens = 0
        blocks_sum = 0
        bs = cfg.block_size
        res_tokens = self.res_tokens
        offload_tokens = 0  # KV tokens copied GPU->host by requests outgrowing the resident set this step
        if per_request:
            for r in plan.decode:
                ctx = r.prompt_len + r.generated  # == r.ctx while decoding
                ctx_tokens += ctx
                blocks_sum += -(-ctx // bs)
                att_tokens += ctx if ctx < res_tokens else res_tokens
                r.recall_sum += 1.0
                r.recall_n += 1
            recall_sum = float(n_dec)
        else:
            remote = self.remote
            link = None
            if self._adaptive:
                lg = self.log
                link = StepLink(lg.dur[-1] if lg.dur else None, self.h2d_Bps, self.host_bpbh, n_dec)
            miss_sum = self.miss_sum  # local in the hot loop (the same additions, in order)
            count = not (short is None or self.spec_k)  # n_dense and n_cross counted here
            w1 = w + 1
            plain = self._slices  # every request on a profile; no remote fetch, no repair: the same figures, fewer ops
            if plain:
                for r in plan.preempted:  # (steady until the update before this schedule)
                    if r.steady is not None:
                        self._settle(r)
                self._plain_steps += 1
                lazy = self._lazy_ok
                n_steady = 0
            for r in plan.decode if plain else ():
                st = r.steady
                if st is not None:  # on its tail, past its short context and the resident set: the same figures
                    blocks_sum += -(-(r.prompt_len + r.generated) // bs)
                    miss_sum += st[1]
                    recall_sum += st[2]
                    fetch_slices += st[0]
                    n_steady += 1
                    continue
                ctx = r.prompt_len + r.generated
                att_tokens += ctx if ctx < res_tokens else res_tokens
                if ctx <= w1:  # as below
                    if ctx <= w:
                        r.recall_sum += 1.0
                        r.recall_n += 1
                        recall_sum += 1.0
                        if count:
                            n_dense += 1
                        continue
                    offload_tokens += ctx - 1
                    if count:
                        n_cross += 1
                blocks_sum += -(-ctx // bs)
                pol = r.policy
                prof = pol.profile
                i = pol.i = pol.i + 1
                sl, _miss, rec, _ = prof.slice_tail if i >= prof.n else prof.slice_rows[i]
                miss_sum += _miss
                r.fetch_blocks += sl
                r.recall_sum += rec
                r.recall_n += 1
                recall_sum += rec
                fetch_slices += sl
                if lazy and i >= prof.n and ctx > w1 and ctx >= res_tokens:  # every later step as this one
                    r.steady = (sl, _miss, rec, self._plain_steps)
                    self._steady[r.id] = r
            if plain:
                att_tokens += n_steady * res_tokens
            for r in () if plain else plan.decode:
                ctx = r.prompt_len + r.generated
                att_tokens += ctx if ctx < res_tokens else res_tokens
                if ctx <= w1:  # short (never without the rule: w1 = 0)
                    if ctx <= w:  # resident-dense: attends its whole KV in place, nothing selected or fetched
                        r.recall_sum += 1.0
                        r.recall_n += 1
                        recall_sum += 1.0
                        if count:
                            n_dense += 1
                        continue
                    offload_tokens += ctx - 1  # ShortContext.offload_tokens: its KV so far, once
                    if count:
                        n_cross += 1
                blocks_sum += -(-ctx // bs)
                pol = r.policy
                prof = pol.profile
                if prof is not None:  # inlined RequestPolicy.next() for the profile fast path
                    i = pol.i = pol.i + 1
                    f, _miss, rec, rem = prof.tail if i >= prof.n else prof.rows[i]
                else:
                    f, _miss, rec, rem = pol.next(link)  # an exact episode (rscale 1)
                if rpf and rem:
                    u = rem * pol.rscale * Lf * kvh
                    remote_units += u
                    remote.received(r, u * self.bpbh)
                miss_sum += _miss
                sl = f * Lf * kvh
                if repair_ids and r.id in repair_ids:  # the beside prediction's repair fetches this step's drift
                    repair_slices += sl
                    sl += sl
                r.fetch_blocks += sl
                r.recall_sum += rec
                r.recall_n += 1
                recall_sum += rec
                fetch_slices += sl
            self.miss_sum = miss_sum
            self.sel_n += n_dec - n_dense
            if mode.on_demand:
                inline_slices, fetch_slices = fetch_slices, 0.0
        self.recall_sum += recall_sum
        self.recall_n += n_dec
        n_sel = n_dec - n_dense  # decode requests that select (and, sparse, predict and fetch)
        if K:  # K + 1 positions a request; the lookahead query is among them (no draft row)
            gemm_tokens = n_dec * (K + 1) + n_pf
        else:
            gemm_tokens = n_dec + n_pf + (n_sel if mode.drafts else 0)  # + draft token per request
        base = self._per_token(gemm_tokens)
        c = base + pf_attn
        if not mode.selects:
            kv = ctx_tokens * self.bpt_layer * (K + 1 if K else 1)
            c += pred.time("attn_decode", {"kv_bytes": kv, "requests": n_dec})
        elif n_dec:
            c += self._time1("attn_decode", "kv_bytes", att_tokens * self.bpt_layer)  # one read for all positions
        if win_attn is not None and n_dec:  # a windowed layer reads min(ctx, W) tokens a request, once a position
            reads = K + 1 if K else 1
            for w, tok in kinds.window_tokens([r.prompt_len + r.generated for r in plan.decode]).items():
                win_attn[w] += pred.time("attn_decode", {"kv_bytes": tok * self.bpt_layer * reads, "requests": n_dec})
        score_s = topk_s = sel_s = 0.0
        side_bytes = 0.0  # HBM bytes per layer the side stream moves (summary reads, top-K, landing transfers)
        if mode.selects and n_sel:
            summary_bytes = blocks_sum * kvh * self.score_bpbh
            score_s = pred.time("score", {"summary_bytes": summary_bytes})
            topk_s = pred.time("topk", {"elements": blocks_sum * kvh}) if cfg.prediction_topk else 0.0
            side_bytes = (summary_bytes + 8.0 * blocks_sum * kvh) * (K if beside else 1)  # beside: K candidates
            if self._sparse:
                sel_s = self._time1("select", "rows", n_sel * kvh)
                c += self._time1("sparse_overhead", "requests", n_sel)

        # First fills of requests that finished prefill now (their first decode step waits for them).
        fill = 0.0
        n_offload_pf = n_pf  # prefill tokens whose KV is offloaded to the host (sparse modes)
        for ch in plan.prefill:
            r, n = ch.req, ch.n
            if short is not None and short.dense(r.prefill_target):  # stays on the GPU: no offload, no fill
                n_offload_pf -= n
                continue
            if r.policy is not None and r.prefill_done + n >= r.prefill_target:
                sl = r.policy.first_fill() * Lf * kvh
                r.fetch_blocks += sl
                fill += sl

        background = mode.background
        # a decode chain (SimConfig.decode_chain): the host's round trip is paid once a chain of ordinary steps
        chain = 1
        w = self.sched.waiting  # (a request waits once it has arrived: the queue holds the trace's future ones)
        waiting = bool(w) and w[0].ready_t <= self.env.now
        if self.chain_max > 1 and n_dec and not plan.prefill and not K and not n_dense and not waiting:
            if not n_cross:
                chain = self.chain_max
        elif self.spec_chain_max > 1 and K and n_dec and not plan.prefill and not n_dense and not waiting:
            if not n_cross:  # a chain of speculative steps (the executor's run_chain): the round trip once a chain
                chain = self.spec_chain_max
        head_s = self._head_cache.get(chain) if self._memo else None
        if head_s is None:
            head_s = pred.time("step_overhead", {"chain": chain})
            if self._memo:
                self._head_cache[chain] = head_s
        if mode.selects_in_place:
            c += score_s + topk_s
        net_bytes = 0.0
        if mode.on_demand:
            layer_bytes = (inline_slices + fill) / Lf * self.host_bpbh
            c += score_s + topk_s + sel_s + self._copy_s(layer_bytes)
            h2d = (inline_slices + fill) * self.host_bpbh
            x = 0.0
        elif background:
            fetch_slices -= repair_slices  # (the repair's copies run after the pass: repair_tail_s)
            layer_bytes = 0.0 if cfg.no_transfer else (fetch_slices + fill) / Lf * self.host_bpbh
            x = self._copy_s(layer_bytes)
            if rpf and remote_units > 0:
                # Remote misses cross the NIC first; a layer's transfer waits for its share of them.
                net_bytes = remote_units * self.bpbh
                x = max(x, self.remote.fetch_s(net_bytes) / Lf)
            repair_x = 0.0 if cfg.no_transfer else self._copy_s(repair_slices / Lf * self.host_bpbh)
            h2d = layer_bytes * Lf + (0.0 if cfg.no_transfer else repair_slices * self.host_bpbh)
            side_bytes += layer_bytes
            if not K or beside:  # (after: a speculative step's side work runs after the pass, nothing beside it)
                if cfg.transfer_path == "uva":
                    c += cfg.gather_sm_share * x
                # Side work overlapped with compute is not free: its HBM traffic is taken from the compute stream's.
                c += pred.time("side_contention", {"hbm_bytes": side_bytes})
        else:
            h2d = 0.0
            x = 0.0
        draft_s = draft_one = 0.0
        # the executor's head runs K times a speculative step: K - 1 chain steps and the proposal after the
        # acceptance. A lookahead step without speculation makes that proposal too (its cost is in the fitted step),
        # so lookahead adds K - 1 head steps; dense runs no head without speculation, so it adds all K.
        n_heads = K - 1 if mode.drafts else K
        if K and self.cfg.speculative_gamma is None:  # the head's steps over the batch (before the lm_head)
            draft_one = pred.time("draft_step", {"tokens": n_dec})
            draft_s = n_heads * draft_one
        # a speculative step of the resident working set: each full layer's commit after the acceptance, on the
        # compute stream, feeding that layer's side stage (oasis_sim.spec_pipeline; dense's pass wrote its pages)
        commit_s = pred.time("spec_commit", {"k": K}) if K and background else 0.0
        n_tail = n_dec * (K + 1 if K else 1) + len(plan.prefill)
        if self._memo:
            tail_s = self._lm_cache.get(n_tail)
            if tail_s is None:
                tail_s = self._lm_cache[n_tail] = pred.time("lm_head", {"tokens": n_tail})
        else:
            tail_s = pred.time("lm_head", {"tokens": n_tail})  # a step's last predictor call
        self.h2d_bytes += h2d
        if self._sparse and n_offload_pf:  # prefill KV offloaded to host DRAM on the GPU->host path
            nbytes = n_offload_pf * self.host_bpt
            self.d2h_bytes += nbytes
            self.gpu.d2h.account(nbytes, self.gpu.d2h.duration(nbytes))
        offload_s = 0.0  # the crossing requests' one-time copy of their KV so far
        if offload_tokens:
            nbytes = offload_tokens * self.host_bpt
            offload_s = self.gpu.d2h.duration(nbytes)
            self.d2h_bytes += nbytes
            self.gpu.d2h.account(nbytes, offload_s)

        if beside:  # the beside stage's launches beyond an ordinary step's, taken from each full layer's pass
            c += pred.time("spec_beside", {})
        compute_s = c if win_attn is None else kinds.per_layer(c, {w: base + a for w, a in win_attn.items()})
        if K:
            layers_s = L * c if win_attn is None else sum(compute_s)
            verify_s = layers_s + head_s + tail_s  # the verify pass on the compute stream
            if self.cfg.speculative_gamma is not None:
                draft_one = self.cfg.speculative_gamma * verify_s
                draft_s = n_heads * draft_one
            if self.spec_policy is not None:
                self.spec_policy.observe_cost(draft_one, verify_s)  # γ as the executor measures it: one head step
            head_s += draft_s  # the chain runs on the compute stream before the layers
            if beside:  # K candidates beside the pass; after the acceptance the repair (oasis_sim.spec_pipeline)
                score_s, topk_s = K * score_s, K * topk_s
                if self._repair_on:  # (no request's acceptance can move its prediction: no repair launched)
                    rep_s = pred.time("spec_repair", {}) + sel_s  # a layer's repair prediction, then its plan
                    tail_s += spec_pipeline.repair_tail_s(Lf, rep_s, repair_x, commit_s)
                else:  # the commits alone
                    tail_s += spec_pipeline.commit_tail_s(Lf, commit_s)
            elif background:  # the next step's prediction needs the acceptance: after the pass, not beside it
                # each layer's commit, then its prediction (one layer ahead of its copy), then its copy
                tail_s += spec_pipeline.after_tail_s(Lf, score_s + topk_s + sel_s, x, commit_s)
                background = False
        side_s, sel_bg = score_s + topk_s if background else 0.0, sel_s if background else 0.0
        if win_attn is not None and background:  # side work and transfers on the full layers only
            zero = dict.fromkeys(kinds.distinct, 0.0)
            side_s, sel_bg, x = (kinds.per_layer(v, zero) for v in (side_s, sel_bg, x))
        work = LayerWork(L, head_s, compute_s, tail_s, background, side_s, sel_bg, x)
        self._prev_work, self._last_work = self._last_work, work
        t0 = self.env.now
        record = self.timeline is not None and self.steps < cfg.timeline_steps
        if cfg.event_mode == "events":
            out = self._events_out
            out.clear()
            yield self.env.process(
                self.pipe.step_events(self.env, work, self.gpu.compute, self.gpu.side, self.gpu.h2d.resource, out)
            )
            timing = out[0]
            if t0 + offload_s > timing.end:
                yield at(self.env, self._wait_offload(timing, t0 + offload_s))
            floor = self._step_floor(n_dec)
            if t0 + floor > timing.end:  # the least a step lasts (a host loop beside the GPU): not a stall
                timing.end = t0 + floor
                yield at(self.env, timing.end)
        else:
            timing = self.pipe.step_closed(t0, work, record)
            if t0 + offload_s > timing.end:
                self._wait_offload(timing, t0 + offload_s)
            floor = self._step_floor(n_dec)
            self._last_gpu_floor = (timing.end - t0, floor)  # the fast-forward's: the GPU's step and the floor
            if t0 + floor > timing.end:  # the least a step lasts (a host loop beside the GPU): not a stall
                timing.end = t0 + floor
            yield at(self.env, timing.end)
        self.steps += 1
        self.stall_s += timing.stall_s
        if timing.stall_s and n_dec:
            share = timing.stall_s / n_dec
            for r in plan.decode:
                r.stall_s += share
        if self.spec_policy is not None and n_dec and not plan.prefill and not n_dense and not offload_tokens:
            self.spec_policy.observe_step(K, timing.end - t0)  # a plain step's time by draft length (0: ordinary)
        self._spec_emit(plan, ks)
        lg = self.log
        lg.t.append(t0)
        lg.dur.append(timing.end - t0)
        lg.decode.append(n_dec)
        lg.emitted.append(n_dec + sum(self.emitted.values()) - len(self.emitted))
        lg.prefill.append(n_pf)
        lg.h2d.append(h2d)
        lg.net.append(net_bytes)
        lg.stall.append(timing.stall_s)
        if record:
            self.timeline.add_step(self.steps - 1, timing, n_dec, n_pf, h2d)
        return timing

    def _window_prefill(self, plan: Plan) -> dict:
        """Per window W, a windowed layer's prefill attention this step (``LayerKinds.prefill_past``)."""
        pred, prefill_past = self.pred, self.kinds.prefill_past
        out = {}
        for w in self.kinds.distinct:
            t = 0.0
            for ch in plan.prefill:
                past = prefill_past(ch.n, ch.req.prefill_done, w)
                t += pred.time("attn_prefill", {"tokens": ch.n, "past_tokens": past})
            out[w] = t
        return out

    def _settle(self, r) -> None:
        """Add a steady request's figures of the plain steps since it became steady, one step at a time as the
        loop would have (the same floats), and take it out of the steady set."""
        sl, _, rec, since = r.steady
        n = self._plain_steps - since
        fb, rs = r.fetch_blocks, r.recall_sum
        for _ in range(n):
            fb += sl
            rs += rec
        r.fetch_blocks, r.recall_sum = fb, rs
        r.recall_n += n
        r.policy.i += n
        r.steady = None
        del self._steady[r.id]

    def _time1(self, op: str, name: str, value) -> float:
        """``pred.time(op, {name: value})``, memoised by ``(op, value)`` for memoisable predictors."""
        if not self._memo:
            return self.pred.time(op, {name: value})
        key = (op, value)
        v = self._time1_cache.get(key)
        if v is None:
            v = self._time1_cache[key] = self.pred.time(op, {name: value})
        return v

    def _step_floor(self, n_dec: int) -> float:
        """The predictor's ``step_floor`` for ``n_dec`` decode requests (memoised for memoisable predictors)."""
        floor = self._floor_cache.get(n_dec) if self._memo else None
        if floor is None:
            floor = self.pred.time("step_floor", {"requests": n_dec})
            if self._memo:
                self._floor_cache[n_dec] = floor
        return floor

    # -- speculative decoding ---------------------------------------------------------------------------------
    def _spec_ks(self, plan: Plan, n_dense: int):
        """Drafts per decode request of a speculative step (``plan.decode``'s order), or None for the ordinary step:
        no decode, a short or crossing request (as the executor), or no request drafting."""
        dec = plan.decode
        if not dec or n_dense:
            return None
        short = self.short
        if short is not None and any(short.crossing(r.prompt_len + r.generated) for r in dec):
            return None
        room = [r.max_tokens - r.generated - 1 for r in dec]  # never more tokens than a request may still emit
        pol = self.spec_policy
        if pol is None:
            k = max(0, min(self.spec_k, min(room)))
            return [k] * len(dec) if k else None
        if pol.probe_due():  # an ordinary step, timed (AdaptiveK.observe_step), as the executor's
            return None
        k = pol.choose_batch([r.id for r in dec])  # one length a step, as the executor
        ks = [max(0, min(k, m)) for m in room]
        return ks if max(ks) else None

    def _spec_draw(self, plan: Plan, ks, K: int, beside: bool) -> set:
        """Draw the step's accepted drafts a decode request (``spec_drawn``; ``_spec_emit`` emits them after the
        step) and return, ``beside``, the ids of the requests whose beside prediction needs a repair."""
        draw, rnd = self.spec_accept.draw, self.spec_random
        self.spec_drawn = [draw(k, rnd) if k else 0 for k in ks]
        if not beside:
            return set()
        s_hat = self._s_hat.get(K)
        if s_hat is None:
            s_hat = self._s_hat[K] = spec_pipeline.chosen_index(self.spec_accept.rate, K)
        dec = plan.decode
        pos = [r.prompt + r.generated - 1 for r in dec]  # the input token's position
        self._repair_on = spec_pipeline.repair_on(pos, ks, K, s_hat, self.cfg.block_size)
        rep = spec_pipeline.repaired(pos, self.spec_drawn, K, s_hat, self.cfg.block_size)
        self.spec_repairs += sum(rep)
        return {r.id for r, x in zip(dec, rep) if x}

    def _spec_emit(self, plan: Plan, ks) -> None:
        """The step's emitted tokens (``self.emitted``, for ``sched.update``): ``1 + n`` a drafting request, ``n``
        drawn by the acceptance model; the adaptive policy observes every decode request's step."""
        self.emitted = {}
        if not self.spec_k:
            return
        pol = self.spec_policy
        if not ks:
            if pol is not None:
                for r in plan.decode:
                    pol.observe(r.id, 0, 0)
            return
        tokens = 0
        for r, k, n in zip(plan.decode, ks, self.spec_drawn):
            if n:
                self.emitted[r.id] = n + 1
            tokens += n + 1
            self.spec_accepts[k, n] += 1
            if pol is not None:
                pol.observe(r.id, k, n)
        self.spec_steps += 1
        self.spec_req_steps += len(ks)
        self.spec_tokens += tokens

    def spec_summary(self) -> dict:
        """summary.json's speculative figures: ``speculative_k``, ``speculative_steps``, ``accepted_tokens_per_step``
        (mean tokens a decode request emitted in a speculative step), ``accepted_hist`` (``{"k": [request-steps
        accepting 0 .. k]}``, a recording's form) and, with ``auto``, the final ``speculative_gamma_used``."""
        hist = {}
        for (k, n), c in sorted(self.spec_accepts.items()):
            if k:
                hist.setdefault(str(k), [0] * (k + 1))[n] += c
        out = {
            "speculative_k": self.cfg.speculative_k,
            "speculative_steps": self.spec_steps,
            "accepted_tokens_per_step": round(self.spec_tokens / self.spec_req_steps, 6)
            if self.spec_req_steps
            else None,
            "accepted_hist": hist,
        }
        if self.cfg.spec_predict == "beside":
            out["spec_predict_repairs"] = self.spec_repairs
        if self.spec_policy is not None:
            out["speculative_gamma_used"] = round(self.spec_policy.gamma, 6)
        return out

    def copy_in(self, nbytes: float) -> float:
        """Copy ``nbytes`` host->GPU now, outside a step (a prefix-cache host-tier hit); returns when it ends. In the
        closed form it queues on the copy path behind the steps' transfers (``LayerPipeline.link_free``), which then
        queue behind it; with ``event_mode='events'`` it takes the path from now, without that queueing."""
        start = self.env.now
        if self.cfg.event_mode == "closed" and self.pipe.link_free > start:
            start = self.pipe.link_free
        end = start + self._copy_s(nbytes)
        if self.cfg.event_mode == "closed":
            self.pipe.link_free = end
        self.h2d_bytes += nbytes
        self.prefix_copy_bytes += nbytes
        self.gpu.h2d.account(nbytes, end - start)
        return end

    @staticmethod
    def _wait_offload(timing: StepTiming, end: float) -> float:
        """Extend a step to ``end``, when the crossing requests' copy to the host ends; the wait is a stall."""
        timing.stall_s += end - timing.end
        timing.end = end
        return end

    def _copy_s(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return self.h2d_lat + nbytes / self.h2d_Bps
