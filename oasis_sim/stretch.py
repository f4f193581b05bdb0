"""The fast-forward of a whole-KV mode (``dense``, a model without windows): many steps at once, prefill included.

After a step, the next steps of the one scheduler are known in advance while nothing from outside can change them:
every running request either decodes (one token a step) or prefills (chunks of ``chunk_tokens`` shared in admission
order, as ``Scheduler.schedule`` shares them), a request that ends its prefill decodes from the next step, the
waiting queue's head cannot be admitted (it was tried and blocked, and the free memory only shrinks while no request
ends; or it is not ready yet) and no event is due. :class:`WholeKVStretch` then prices each step of the stretch from
the batch's totals alone (decode requests, their context, the prefill chunks), as ``SimEngine.execute`` prices a
whole-KV step (the same predictor calls: the token GEMMs, every chunk's prefill attention, the decode attention over
the batch's KV, the step overhead and its decode chain, the LM head, the step floor), and applies the stretch to each
request once at its end. It ends at the first of: ``fast_forward`` steps, a request's last token (that step
included), the step before the next event or the waiting head's ready time, the most steps whose memory growth the
pools can give (so no preemption can fall inside it).

Exact but for float rounding: a step lasts ``head + L · c + tail`` here against the pipeline's ``L`` additions, and
the pools move once at the stretch's end (by whole bytes: the same levels; the memory series gets one point, the
peak is the same since the holdings only grow inside a stretch). ``tests/unit/test_sim_fast_forward.py`` compares
it with every step simulated on every summary and per-request figure.
"""

from __future__ import annotations

from oasis_core import modes
from oasis_core.scheduler import DECODE, PREFILL

from .pipeline import at


def applies(cfg, model) -> bool:
    """Whether a run takes this stretch: a whole-KV mode that selects, drafts and copies nothing, no windows, the
    closed form, no speculation, no prefill node or prefix cache (no event besides arrivals), prefills computed."""
    m = modes.get(cfg.mode)
    return (
        m.whole_kv_on_gpu
        and not (m.selects or m.drafts or m.background or m.on_demand)
        and not model.is_hybrid
        and cfg.event_mode == "closed"
        and not cfg.spec_max_k
        and cfg.split == "none"
        and not cfg.prefix_cache
        and not cfg.decode_only
    )


class WholeKVStretch:
    """The stretch of one engine (``SimEngine``): :meth:`take` after a step, a generator the engine yields from."""

    def __init__(self, engine):
        self.eng = engine
        self.chunk = engine.cfg.chunk_tokens
        self.bpt_layer = engine.bpt_layer

    # -- pricing -------------------------------------------------------------------------------------------------
    def _step_s(self, n_dec: int, ctx_tokens: int, chunks: list, waiting: bool) -> float:
        """One step's duration: ``SimEngine.execute`` for a whole-KV plan of ``n_dec`` decode requests holding
        ``ctx_tokens`` tokens and the prefill ``chunks`` ``[(tokens, past_tokens)]``."""
        eng = self.eng
        pred = eng.pred
        n_pf = 0
        pf_attn = 0.0
        for n, past in chunks:
            pf_attn += pred.time("attn_prefill", {"tokens": n, "past_tokens": past})
            n_pf += n
        c = eng._per_token(n_dec + n_pf) + pf_attn
        c += pred.time("attn_decode", {"kv_bytes": ctx_tokens * self.bpt_layer})
        chain = eng.chain_max if eng.chain_max > 1 and n_dec and not chunks and not waiting else 1
        head = eng._head_cache.get(chain)
        if head is None:
            head = eng._head_cache[chain] = pred.time("step_overhead", {"chain": chain})
        n_tail = n_dec + len(chunks)
        tail = eng._lm_cache.get(n_tail)
        if tail is None:
            tail = eng._lm_cache[n_tail] = pred.time("lm_head", {"tokens": n_tail})
        gpu = head + eng.L * c + tail
        floor = eng._step_floor(n_dec)
        return gpu if gpu > floor else floor

    # -- the stretch ---------------------------------------------------------------------------------------------
    def take(self, plan, timing, done):
        """SimPy sub-process: after the step just run (its ``timing``; ``done``: the requests it ended), advance the
        stretch that follows, if any. Returns the steps taken (0: none)."""
        eng = self.eng
        sched, env = eng.sched, eng.env
        now = env.now
        # a request the step's growth preempted freed memory after the schedule: the next may admit the head
        if sched._preempted or timing.stall_s or not eng._memo or (eng.timeline is not None and eng.steps < eng.cfg.timeline_steps):
            return 0
        pipe = eng.pipe
        if pipe.side_free > now or pipe.link_free > now:
            return 0
        head = sched.waiting[0] if sched.waiting else None
        nxt = env.peek()
        if head is not None:
            if head.ready_t > now:
                nxt = min(nxt, head.ready_t)
            elif done or timing.start < head.ready_t:
                return 0  # memory freed after the schedule, or it came during the step: the next may admit it
            elif eng._quiet_arrivals:  # tried and blocked: an arrival queues behind it and changes nothing
                nxt = float("inf")
        k_max = eng.ff_max
        dec, pre = [], []
        for r in sched.running.values():
            if r.state == DECODE:
                if r.first_token_t is None:
                    return 0
                dec.append(r)
                left = r.max_tokens - r.generated
                if left < k_max:
                    k_max = left  # its finishing step may close the stretch
            elif r.state == PREFILL:
                pre.append(r)
            else:
                return 0
        if k_max <= 0 or not (dec or pre):
            return 0
        # step by step from the batch's totals: durations, who joins the decode batch when, the last step
        n_dec = len(dec)
        ctx_tokens = 0
        for r in dec:
            ctx_tokens += r.prompt_len + r.generated
        rem = [r.prefill_target - r.prefill_done for r in pre]
        joined = {}  # prefilling request -> the step that ends its prefill
        rems = [tuple(rem)]  # the prefills' remaining tokens after each step
        n_decs, n_pfs = [], []
        waiting = bool(sched.waiting)
        durs, starts = [], []
        t = now
        j = 0
        while j < k_max and t < nxt:
            j += 1
            chunks = []
            if pre:
                budget = self.chunk
                for i, r in enumerate(pre):
                    if budget <= 0:
                        break
                    x = rem[i]
                    if x <= 0:
                        continue
                    n = x if x < budget else budget
                    chunks.append((n, r.prefill_target - x))
                    rem[i] = x - n
                    budget -= n
                    if x == n:
                        joined[r] = j
                rems.append(tuple(rem))
            d = self._step_s(n_dec, ctx_tokens, chunks, waiting)
            starts.append(t)
            durs.append(d)
            n_decs.append(n_dec)
            n_pfs.append(sum(n for n, _ in chunks))
            t += d
            ctx_tokens += n_dec
            for r, jf in joined.items():
                if jf == j:  # decodes from the next step
                    g = r.generated if r.generated else 1
                    n_dec += 1
                    ctx_tokens += r.prompt_len + g
                    last = j + r.max_tokens - g  # its finishing step
                    if last < k_max:
                        k_max = last
        k = self._fitting(dec + pre, joined, j)
        if k <= 0:
            return 0
        del durs[k:], starts[k:]
        yield at(env, starts[-1] + durs[-1])
        self._apply(dec, pre, joined, k, starts, durs, rems[k] if pre else ())
        lg = eng.log
        lg.decode.extend(n_decs[:k])
        lg.emitted.extend(n_decs[:k])
        lg.prefill.extend(n_pfs[:k] if pre else [0] * k)
        return k

    @staticmethod
    def _ctx_at(r, j: int, joined: dict):
        """``r.ctx`` after the stretch's step ``j`` (0: now), or None while it still prefills."""
        if r.state == DECODE:
            g = r.generated + j
        else:
            jf = joined.get(r)
            if jf is None or jf > j:
                return None
            g = (r.generated if r.generated else 1) + j - jf
        x = g - (r.prefill_target - r.prompt_len)
        return r.prefill_target + (x if x > 0 else 0)

    def _fitting(self, reqs, joined, k: int) -> int:
        """The most of ``k`` steps whose memory growth the pools can give (halved until it fits): a step whose growth
        does not fit preempts, so the stretch ends before it."""
        eng = self.eng
        need = eng.sched.acct.need
        free_gpu, free_host = eng.gpu.hbm.free, eng.sched.acct.host.free
        ctx_at = self._ctx_at
        while k > 0:
            dg = dh = 0.0
            for r in reqs:
                ctx = ctx_at(r, k, joined)
                if ctx is not None:
                    gpu, host = need(r, ctx, staging=False)
                    dg += gpu - r.gpu_held
                    dh += host - r.host_held
            if not (dg > 0 and dg > free_gpu or dh > 0 and dh > free_host):
                return k
            k //= 2
        return 0

    def _apply(self, dec, pre, joined, k: int, starts: list, durs: list, rem_after) -> None:
        """Every request, the engine's counters and step times, and the pools, as ``k`` steps of the exact path."""
        eng = self.eng
        sched = eng.sched
        end = starts[-1] + durs[-1]
        ctx_at = self._ctx_at
        grown_prev, grown, ended = [], [], []
        decoded = 0  # request-steps that decoded
        for i, r in enumerate(pre):
            jf = joined.get(r)
            if jf is None or jf > k:  # still prefilling: its chunks of the stretch
                r.prefill_done = r.prefill_target - rem_after[i]
        for r in dec + pre:
            if r.state == DECODE:
                steps = k
            else:
                jf = joined.get(r)
                if jf is None or jf > k:
                    continue
                steps = k - jf
            prev, ctx = ctx_at(r, k - 1, joined), ctx_at(r, k, joined)
            if r.state != DECODE:
                r.prefill_done = r.prefill_target
                r.state = DECODE
                if not r.generated:
                    r.generated = 1
                    r.first_token_t = starts[jf - 1] + durs[jf - 1]
            r.generated += steps
            r.recall_sum += float(steps)
            r.recall_n += steps
            decoded += steps
            if prev is not None:
                grown_prev.append((r, prev))
            if r.generated >= r.max_tokens:
                ended.append(r)
            else:
                grown.append((r, ctx))
        # as Scheduler.update at the last step's end: those that emitted their last token end, then the rest grow;
        # before, every request holds what it held after the step before it (the pools' peak)
        if ended:
            sched.grow_fitting(grown_prev)
            # Scheduler.update's order: the decoded (admission order), then those whose prefill ended at this step
            ended.sort(key=lambda r: (joined.get(r) == k, r.seq))
            for r in ended:
                sched.finish(r, end)
        sched.grow_fitting(grown)
        sched.step += k
        for r, jf in joined.items():
            if jf <= k and r.state == DECODE:
                sched._register(r)  # its crossing bucket, as _grow_all registers a request that ends its prefill
        eng.recall_sum += float(decoded)
        eng.recall_n += decoded
        eng.steps += k
        eng.ff_steps += k
        lg = eng.log
        lg.t.extend(starts)
        lg.dur.extend(durs)
        lg.stall.extend([0.0] * k)
        lg.h2d.extend([0.0] * k)
        lg.net.extend([0.0] * k)
