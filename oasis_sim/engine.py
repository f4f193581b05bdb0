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
``oasis_exec.speculative``): a decode step in which no request is short or crossing drafts ``k_r`` tokens for
request ``r`` (fixed: ``speculative_k``, the batch's least ``max_tokens - generated - 1`` bounding it; ``auto``:
``oasis_core.speculation.AdaptiveK`` per request, as the executor) and verifies ``K = max k_r`` for all (a
request's drafts past its own ``k_r`` count as rejected, as the executor's pass). It costs the draft chain, ``K``
draft-head steps over the batch (the predictor's ``draft_step``, or ``K · speculative_gamma`` times the verify
pass), on the compute stream before the layers, plus the verify pass: every layer's GEMMs, norms and the LM head
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
prediction one layer ahead of the copy, none beside the pass's compute.

Per step the engine records (``StepLog``): start, duration, decode and prefill tokens, host→GPU bytes, stall (and,
not in ``steps.csv``, the tokens the decodes emitted).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import simpy

from oasis_core import modes
from oasis_core.block_scorers import get_scorer
from oasis_core.geometry import KVGeometry
from oasis_core.scheduler import Plan
from oasis_core.speculation import AdaptiveK, ChainAcceptance

from .config import SimConfig
from .hardware import GPU
from .pipeline import LayerPipeline, LayerWork, StepTiming, at
from .policy import StepLink, cap_policy
from .predictor import TimePredictor
from .scheduler import SimScheduler

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


class Engine:
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
        self.score_bpbh = self.sum_bpbh * get_scorer(cfg.block_score).vectors_read / 2
        self.res_tokens = (cfg.top_k + 1) * cfg.block_size
        self.short = cfg.short_context_rule  # None: no request runs resident-dense
        self._events_out: list[StepTiming] = []
        self._memo = bool(getattr(type(predictor), "memoisable", False))
        self._tok_cache: dict = {}
        self._lm_cache: dict = {}
        self._head_s = predictor.time("step_overhead", {}) if self._memo else 0.0
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
                    return
                nxt = self.next_ready_time()
                self.wake = env.event()
                if nxt is not None and nxt > env.now:
                    yield env.any_of([self.wake, at(env, nxt)])
                else:
                    yield self.wake
                continue
            timing = yield from self.execute(plan)
            done = sched.update(plan, timing.end, emitted=self.emitted)
            if self.spec_policy is not None:
                for r in done:
                    self.spec_policy.drop(r.id)

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
        cfg, pred, L, kvh = self.cfg, self.pred, self.L, self.kvh
        mode = modes.get(cfg.mode)
        short = self.short
        n_dec = len(plan.decode)
        n_pf = 0
        pf_attn = 0.0
        for ch in plan.prefill:
            r, n = ch.req, ch.n
            pf_attn += pred.time("attn_prefill", {"tokens": n, "past_tokens": r.prefill_done})
            n_pf += n
        n_dense = 0  # decode requests running resident-dense in a sparse mode
        if short is not None:
            for r in plan.decode:
                if short.dense(r.prompt + r.generated):
                    n_dense += 1
        n_sel = n_dec - n_dense  # decode requests that select (and, sparse, predict and fetch)
        ks = self._spec_ks(plan, n_dense) if self.spec_k else None  # drafts per decode request, or None
        K = max(ks) if ks else 0
        if K:  # K + 1 positions a request; the lookahead query is among them (no draft row)
            gemm_tokens = n_dec * (K + 1) + n_pf
        else:
            gemm_tokens = n_dec + n_pf + (n_sel if mode.drafts else 0)  # + draft token per request
        c = self._per_token(gemm_tokens) + pf_attn

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
        if mode.whole_kv_on_gpu or not n_dec:
            for r in plan.decode:
                ctx = r.prompt + r.generated  # == r.ctx while decoding
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
            for r in plan.decode:
                ctx = r.prompt + r.generated
                att_tokens += ctx if ctx < res_tokens else res_tokens
                if short is not None:
                    if short.dense(ctx):  # attends its whole KV in place: nothing selected or fetched
                        r.recall_sum += 1.0
                        r.recall_n += 1
                        recall_sum += 1.0
                        continue
                    offload_tokens += short.offload_tokens(ctx)
                blocks_sum += -(-ctx // bs)
                pol = r.policy
                prof = pol.profile
                if prof is not None:  # inlined RequestPolicy.next() for the profile fast path
                    i = pol.i = pol.i + 1
                    f, _miss, rec, rem = prof.tail if i >= prof.n else prof.rows[i]
                else:
                    f, _miss, rec, rem = pol.next(link)  # an exact episode (rscale 1)
                if rpf and rem:
                    u = rem * pol.rscale * L * kvh
                    remote_units += u
                    remote.received(r, u * self.bpbh)
                self.miss_sum += _miss
                self.sel_n += 1
                sl = f * L * kvh
                r.fetch_blocks += sl
                r.recall_sum += rec
                r.recall_n += 1
                recall_sum += rec
                fetch_slices += sl
            if mode.on_demand:
                inline_slices, fetch_slices = fetch_slices, 0.0
        self.recall_sum += recall_sum
        self.recall_n += n_dec
        if not mode.selects:
            c += pred.time("attn_decode", {"kv_bytes": ctx_tokens * self.bpt_layer * (K + 1 if K else 1)})
        elif n_dec:
            c += pred.time("attn_decode", {"kv_bytes": att_tokens * self.bpt_layer})  # one read for all positions
        score_s = topk_s = sel_s = 0.0
        side_bytes = 0.0  # HBM bytes per layer the side stream moves (summary reads, top-K, landing transfers)
        if mode.selects and n_sel:
            summary_bytes = blocks_sum * kvh * self.score_bpbh
            score_s = pred.time("score", {"summary_bytes": summary_bytes})
            topk_s = pred.time("topk", {"elements": blocks_sum * kvh})
            side_bytes = summary_bytes + 8.0 * blocks_sum * kvh
            if cfg.sparse:
                sel_s = pred.time("select", {"rows": n_sel * kvh})
                c += pred.time("sparse_overhead", {"requests": n_sel})

        # First fills of requests that finished prefill now (their first decode step waits for them).
        fill = 0.0
        n_offload_pf = n_pf  # prefill tokens whose KV is offloaded to the host (sparse modes)
        for ch in plan.prefill:
            r, n = ch.req, ch.n
            if short is not None and short.dense(r.prefill_target):  # stays on the GPU: no offload, no fill
                n_offload_pf -= n
                continue
            if r.policy is not None and r.prefill_done + n >= r.prefill_target:
                sl = r.policy.first_fill() * L * kvh
                r.fetch_blocks += sl
                fill += sl

        background = mode.background
        head_s = self._head_s if self._memo else pred.time("step_overhead", {})
        if mode.selects_in_place:
            c += score_s + topk_s
        net_bytes = 0.0
        if mode.on_demand:
            layer_bytes = (inline_slices + fill) / L * self.host_bpbh
            c += score_s + topk_s + sel_s + self._copy_s(layer_bytes)
            h2d = (inline_slices + fill) * self.host_bpbh
            x = 0.0
        elif background:
            layer_bytes = (fetch_slices + fill) / L * self.host_bpbh
            x = self._copy_s(layer_bytes)
            if rpf and remote_units > 0:
                # Remote misses cross the NIC first; a layer's transfer waits for its share of them.
                net_bytes = remote_units * self.bpbh
                x = max(x, self.remote.fetch_s(net_bytes) / L)
            h2d = layer_bytes * L
            side_bytes += layer_bytes
            if not K:  # (a speculative step runs its side work after the pass: nothing beside the compute)
                if cfg.transfer_path == "uva":
                    c += cfg.gather_sm_share * x
                # Side work overlapped with compute is not free: its HBM traffic is taken from the compute stream's.
                c += pred.time("side_contention", {"hbm_bytes": side_bytes})
        else:
            h2d = 0.0
            x = 0.0
        draft_s = 0.0
        if K and self.cfg.speculative_gamma is None:  # K draft-head steps over the batch (before the step's lm_head)
            draft_s = K * pred.time("draft_step", {"tokens": n_dec})
        n_tail = n_dec * (K + 1 if K else 1) + len(plan.prefill)
        if self._memo:
            tail_s = self._lm_cache.get(n_tail)
            if tail_s is None:
                tail_s = self._lm_cache[n_tail] = pred.time("lm_head", {"tokens": n_tail})
        else:
            tail_s = pred.time("lm_head", {"tokens": n_tail})  # a step's last predictor call
        self.h2d_bytes += h2d
        if cfg.sparse and n_offload_pf:  # prefill KV offloaded to host DRAM on the GPU->host path
            nbytes = n_offload_pf * self.host_bpt
            self.d2h_bytes += nbytes
            self.gpu.d2h.account(nbytes, self.gpu.d2h.duration(nbytes))
        offload_s = 0.0  # the crossing requests' one-time copy of their KV so far
        if offload_tokens:
            nbytes = offload_tokens * self.host_bpt
            offload_s = self.gpu.d2h.duration(nbytes)
            self.d2h_bytes += nbytes
            self.gpu.d2h.account(nbytes, offload_s)

        if K:
            verify_s = L * c + head_s + tail_s  # the verify pass on the compute stream
            if self.cfg.speculative_gamma is not None:
                draft_s = K * self.cfg.speculative_gamma * verify_s
            if self.spec_policy is not None:
                self.spec_policy.observe_cost(draft_s / K, verify_s)  # γ as the executor measures it
            head_s += draft_s  # the chain runs on the compute stream before the layers
            if background:  # the next step's prediction needs the acceptance: after the pass, not beside it
                side = score_s + topk_s + sel_s
                tail_s += L * max(side, x) + min(side, x)  # layer by layer, prediction one layer ahead of its copy
                background = False
        work = LayerWork(
            L, head_s, c, tail_s, background, score_s + topk_s if background else 0.0, sel_s if background else 0.0, x
        )
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
        else:
            timing = self.pipe.step_closed(t0, work, record)
            if t0 + offload_s > timing.end:
                self._wait_offload(timing, t0 + offload_s)
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

    # -- speculative decoding ---------------------------------------------------------------------------------
    def _spec_ks(self, plan: Plan, n_dense: int):
        """Drafts per decode request of a speculative step (``plan.decode``'s order), or None for the ordinary step:
        no decode, a short or crossing request (as the executor), or no request drafting."""
        dec = plan.decode
        if not dec or n_dense:
            return None
        short = self.short
        if short is not None and any(short.crossing(r.prompt + r.generated) for r in dec):
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
        draw, rnd = self.spec_accept.draw, self.spec_random
        tokens = 0
        for r, k in zip(plan.decode, ks):
            n = draw(k, rnd) if k else 0
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
