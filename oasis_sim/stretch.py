"""The fast-forward of a whole-KV mode (``dense``, a model without windows): many steps at once, prefill included.

Once ``Scheduler.schedule`` has made a plan, the steps that follow are known in advance while nothing from outside
can change them: every running request either decodes (one token a step) or prefills (chunks of ``chunk_tokens``
shared in admission order, as ``schedule`` shares them); a request whose prefill ends decodes from the next step
(its first token at that step's end); a request leaves the batch at the step that emits its last token; the waiting
queue's head is admitted by the stretch's own schedule at the first step that starts once it is ready and the pools
can give its prefill's staging (FCFS, as ``schedule``: the heads behind it too, while they fit and the batch has
room; it then prefills with the others, in admission order), or stays blocked (the free memory only shrinks while
no request ends, and after an end it is re-checked: the levels are computed only where a bound cannot tell). No
execute or update runs: :class:`WholeKVStretch` prices each step from the batch's totals (decode requests, their
context, the prefill chunks) with the predictor calls ``SimEngine.execute`` makes for a whole-KV plan (the token
GEMMs, each chunk's prefill attention, the decode attention over the batch's KV, the step overhead with its decode
chain, the LM head, the step floor; a run of decode-only steps with the decode attention as a line in the context),
and applies the stretch to each request (admissions included), the pools and the step log once, at its end. It
stops at the first of: ``fast_forward`` steps; the step before the next event in the queue (none in an open loop
without a prefill node or prefix cache: every request is queued at the start, ready at its arrival); a head the
schedule would reject; any end in a closed loop (whose next request comes then); the last step whose memory growth
the pools can give (a growth that does not fit preempts: the engine then runs that step exactly). ``SimEngine`` runs the plan step by step instead while the timeline records or the predictor is not
memoisable.

Exact but for float rounding: a step lasts ``head + L · c + tail`` here against the pipeline's ``L`` additions, and
the pools move once (whole bytes: the same final levels; the peak is taken from the levels just before each end,
where holdings stop growing; the memory series gets fewer points). ``tests/unit/test_sim_fast_forward.py`` compares
it with every step simulated: every summary and per-request figure and the step log, row by row.
"""

from __future__ import annotations

from bisect import bisect_right

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


class _HBMLevel:
    """The HBM level at a step of the stretch in O(1), where a block is a constant whole number of bytes (every
    figure then a whole number of bytes: the sums exact in any order, the same floats as ``_level``'s). ``base``:
    the level at the start less what the requests decoding or ended hold, plus the staging of those the stretch
    admitted that still prefill; the decoding requests' blocks ``ceil((c0 + m) / bs)`` summed through their
    residues: ``(q + m) // bs = q // bs + m // bs + (q % bs + m % bs >= bs)`` with ``q = c0 + bs - 1``."""

    def __init__(self, level: float, bs: int, pb: float):
        self.base, self.bs, self.pb = level, bs, pb
        self.n = self.q = 0  # decoding requests, the sum of their q // bs
        self.cnt = [0] * bs  # decoding requests by q % bs

    def decode(self, c0: int, held: float) -> None:
        """A request decodes from here on (its context ``c0 + m`` at step ``m``), holding ``held`` until now."""
        q = c0 + self.bs - 1
        self.n += 1
        self.q += q // self.bs
        self.cnt[q % self.bs] += 1
        self.base -= held

    def end(self, c0: int) -> None:
        """A decoding request ends: it holds nothing from here on."""
        q = c0 + self.bs - 1
        self.n -= 1
        self.q -= q // self.bs
        self.cnt[q % self.bs] -= 1

    def at(self, m: int) -> float:
        """The level after step ``m``'s growth (the decoding requests as they are now)."""
        bs = self.bs
        r = m % bs
        blocks = self.q + self.n * (m // bs) + (sum(self.cnt[bs - r :]) if r else 0)
        return self.base + blocks * self.pb


class WholeKVStretch:
    """The stretch of one engine (``SimEngine``): :meth:`take` after a step, a generator the engine yields from."""

    def __init__(self, engine):
        self.eng = engine
        self.chunk = engine.cfg.chunk_tokens
        self.bpt_layer = engine.bpt_layer
        self._prefill_memo: dict = {}  # (tokens, past tokens) -> attn_prefill (a memoisable predictor's)
        # decode requests -> the attn_decode of one token each, the per-token time, the step overhead and LM head,
        # the step floor of _decode_steps (a memoisable predictor's), one memo without a head waiting, one with
        # (int keys, as the engine's memos: no tuple a step)
        self._dec_memo: tuple = ({}, {})

    # -- pricing -------------------------------------------------------------------------------------------------
    def _step_s(self, n_dec: int, ctx_tokens: int, chunks: list, n_pf: int) -> float:
        """One step's duration: ``SimEngine.execute`` for a whole-KV plan of ``n_dec`` decode requests holding
        ``ctx_tokens`` tokens and the prefill ``chunks`` ``[(tokens, past_tokens)]`` (``n_pf`` tokens; at least one
        chunk: no decode chain)."""
        eng = self.eng
        pred = eng.pred
        pf_attn = 0.0
        memo = self._prefill_memo
        for chunk in chunks:
            a = memo.get(chunk)
            if a is None:
                a = memo[chunk] = pred.time("attn_prefill", {"tokens": chunk[0], "past_tokens": chunk[1]})
            pf_attn += a
        tokens = n_dec + n_pf
        c = eng._tok_cache.get(tokens)  # (eng._per_token's memo: the stretch runs only with a memoisable predictor)
        if c is None:
            c = eng._per_token(tokens)
        c += pf_attn
        c += pred.time("attn_decode", {"kv_bytes": ctx_tokens * self.bpt_layer, "requests": n_dec})
        head, tail = self._head_tail(1, n_dec + len(chunks))
        floor = eng._floor_cache.get(n_dec)
        if floor is None:
            floor = eng._step_floor(n_dec)
        gpu = head + eng.L * c + tail
        return gpu if gpu > floor else floor

    def _head_tail(self, chain: int, n_tail: int) -> tuple:
        """The step overhead of a decode chain of ``chain`` and the LM head over ``n_tail`` tokens (memoised)."""
        eng = self.eng
        head = eng._head_cache.get(chain)
        if head is None:
            head = eng._head_cache[chain] = eng.pred.time("step_overhead", {"chain": chain})
        tail = eng._lm_cache.get(n_tail)
        if tail is None:
            tail = eng._lm_cache[n_tail] = eng.pred.time("lm_head", {"tokens": n_tail})
        return head, tail

    # -- the stretch ---------------------------------------------------------------------------------------------
    def run(self, plan):
        """SimPy sub-process: run the step of ``plan`` (just scheduled) and the stretch that follows it. Returns the
        steps taken; 0: none (the engine then runs the plan step by step)."""
        eng = self.eng
        sched, env = eng.sched, eng.env
        now = env.now
        if not eng._memo or (eng.timeline is not None and eng.steps < eng.cfg.timeline_steps):
            return 0
        pipe = eng.pipe
        if pipe.side_free > now or pipe.link_free > now:
            return 0
        self.n_adm = 0  # requests the stretch admitted: the first of sched.waiting
        self.staged = 0.0  # the HBM their prefills hold (staging)
        head = sched.waiting[0] if sched.waiting else None
        nxt, blocked = self._head_events(head, now)  # blocked: the head, ready and just not admitted
        # every running request: [request, c0, joins, ends, admitted, staging] with its context after step j
        # ``c0 + j`` once it decodes (from step ``joins``), its last token at step ``ends``; None while still unknown
        # (a prefill); ``admitted``: the step whose schedule admitted it in the stretch (0: before), ``staging``:
        # the (HBM, host) its prefill then took
        dec, pre, ends = [], [], {}
        ctx_tokens = 0
        for r in sched.running.values():
            if r.state == DECODE:
                if r.first_token_t is None:
                    return 0
                g = r.generated
                c0 = r.prompt_len + g  # == Request.ctx while it decodes
                rec = [r, c0, 0, r.max_tokens - g, 0, None]
                dec.append(rec)
                e = ends.get(rec[3])
                if e is None:
                    ends[rec[3]] = [rec]
                else:
                    e.append(rec)
                ctx_tokens += c0
            elif r.state == PREFILL:
                pre.append([r, 0, None, None, 0, None])
            else:
                return 0
        recs = self.recs = dec + pre  # (decoding first, then prefilling, each in admission order)
        if not recs:
            return 0
        self.n_dec0 = len(dec)
        acct = sched.acct
        self.lvl0 = (acct.hbm.level, acct.host.level)
        self.bs = acct.bs
        self.block_bytes = pb = acct.block_bytes
        # the HBM level in O(1) (_HBMLevel) where every holding is a whole number of bytes, else None: _level's loop
        hbm = None
        if pb is not None and float(pb).is_integer() and float(self.lvl0[0]).is_integer():
            if all(float(rec[0].gpu_held).is_integer() for rec in recs):
                hbm = _HBMLevel(self.lvl0[0], self.bs, pb)
                for rec in dec:
                    hbm.decode(rec[1], rec[0].gpu_held)
        self.hbm = hbm
        # step by step from the batch's totals: durations, who joins or leaves the decode batch when, the last step
        n_dec = len(recs) - len(pre)
        rem = [r.prefill_target - r.prefill_done for r, *_ in pre]  # the prefills' remaining tokens
        # the prefills end in admission order (the chunks go to the first with tokens left): those of pre[:p0] have
        # ended, pre[p0] may have begun, the others have all their tokens left; after each step with a prefill
        # chunk: the step, p0 and rem[p0] (-1 and 0: every prefill ended)
        self.p0 = 0
        pf_steps, pf_i, pf_rem = [], [], []
        n_decs, n_pfs, frees = [], [], []  # frees: (step, the requests it ends, the levels just before)
        durs, starts = [], []
        t = now
        j = 0
        k_cap = eng.ff_max
        last_free = n_out = 0  # the last step that ended requests (the levels fit up to it), the requests ended
        n_grow = len(recs) - len(pre)  # requests that decode in the stretch so far (their holdings grow)
        freed = 0.0  # HBM the ends freed
        self.peak_or_cap = min(acct.hbm.peak, acct.hbm.capacity)
        while j < k_cap:
            if j and head is not None and blocked is None and head.ready_t <= t:
                # the schedule of step j + 1 admits the ready heads that fit, as Scheduler.schedule
                bound = None if hbm is not None else self._bound(j, n_grow, freed)
                head, nxt, blocked = self._admit(head, j, t, rem, pre, n_out, bound)
            if not (t < nxt or not j):  # (the plan's own step whatever comes)
                break
            joined = ()
            if self.p0 == len(rem):  # decode alone until the next end: steps apart only in the batch's context
                last = min(ends) if ends else k_cap
                j0 = j
                t = self._decode_steps(
                    n_dec, ctx_tokens, (last if last < k_cap else k_cap) - j, t, nxt, not j, starts, durs, head
                )
                j = len(durs)
                n = j - j0
                ctx_tokens += n * n_dec
                n_decs.extend([n_dec] * n)
                n_pfs.extend([0] * n)
            else:
                t, ctx_tokens, joined = self._prefill_step(pre, rem, n_dec, ctx_tokens, t, starts, durs, n_decs, n_pfs)
                j += 1
                p0 = self.p0
                pf_steps.append(j)
                pf_i.append(p0 if p0 < len(rem) else -1)
                pf_rem.append(rem[p0] if p0 < len(rem) else 0)
            n_grow += len(joined)
            # the level at step j's update, before its ends free (needed where some end: one whose prefill ends now
            # ends now when its only token is the prefill's)
            ending = j in ends or (joined and any(rec[0].max_tokens == (rec[0].generated or 1) for rec in joined))
            before = hbm.at(j - 1) if hbm is not None and ending else None
            for rec in joined:  # its prefill ends at this step: it decodes from the next
                r = rec[0]
                g = r.generated if r.generated else 1
                rec[1], rec[2], rec[3] = r.prompt_len + g - j, j, j + r.max_tokens - g
                ends.setdefault(rec[3], []).append(rec)
                if rec[3] > j:
                    n_dec += 1
                    ctx_tokens += r.prompt_len + g
                if hbm is not None:  # from its prefill's holding (staging, if the stretch admitted it) to its blocks
                    hbm.decode(rec[1], rec[5][0] if rec[4] else r.gpu_held)
            out = ends.pop(j, None)
            if out:  # they end at this step's update, before the growth; the next schedule may admit the head
                for rec in out:
                    if rec[2] < j:  # (not one that ends with its prefill: it never decoded)
                        n_dec -= 1
                        ctx_tokens -= rec[1] + j
                    if hbm is not None:
                        hbm.end(rec[1])
                # the pools' levels just before the frees (a peak; they must fit) and after: computed only where
                # a bound (at most ceil(m / block_size) blocks more a request, the frees ignored) cannot tell
                levels = None
                if hbm is not None:
                    h0 = self.lvl0[1]
                    levels = ((before, h0), (hbm.at(j), h0))
                    if not self._fits(levels[0]):
                        j = self._last_fitting(last_free, j - 1)
                        break
                elif (bound := self._bound(j - 1, n_grow, freed)) is None or bound > self.peak_or_cap:
                    levels = self._levels(j)
                    if not self._fits(levels[0]):
                        j = self._last_fitting(last_free, j - 1)
                        break
                frees.append((j, out, levels[0] if levels else None))
                n_out += len(out)
                last_free = j
                for rec in out:  # (one the stretch admitted: its staging, which the levels count it from)
                    freed += rec[5][0] if rec[4] else rec[0].gpu_held
                if sched.on_done is not None:
                    break  # a closed loop submits a request at each end
                if not n_dec and self.p0 == len(rem) and (head is None or head.ready_t > t or blocked is not None):
                    break  # nothing left to run
                running = len(sched.running) - n_out + self.n_adm
                if blocked is not None and self._admits(blocked, j, levels, freed, running):
                    blocked = None  # the next step's schedule admits it (and those behind it that fit)
                    nxt = float("inf") if self._quiet else self._peek
        k = j
        if k and not self._fits_at(k, n_grow):
            k = self._last_fitting(last_free, k)
        if k <= 0:
            return 0
        del durs[k:], starts[k:]
        yield at(env, starts[-1] + durs[-1])
        i = bisect_right(pf_steps, k) - 1  # the last prefill step up to k
        self._apply(k, starts, durs, (pf_i[i], pf_rem[i]) if i >= 0 else (-1, 0), [x for x in frees if x[0] <= k])
        lg = eng.log
        lg.decode.extend(n_decs[:k])
        lg.emitted.extend(n_decs[:k])
        lg.prefill.extend(n_pfs[:k] if pre else [0] * k)
        return k

    def _head_events(self, head, t: float) -> tuple:
        """``(nxt, blocked)`` for the waiting queue's ``head`` at ``t``: the stretch's steps start before ``nxt`` (the
        next event in the queue, or the head's ready time); ``blocked``: the head, ready and not admitted by the
        schedule that just ran (it stays so until a request ends: the free memory only shrinks meanwhile)."""
        eng = self.eng
        self._peek = eng.env.peek()
        self._quiet = eng._quiet_arrivals  # an arrival queues behind a blocked head and changes nothing
        if head is None:
            return self._peek, None
        if head.ready_t > t:
            return min(self._peek, head.ready_t), None
        return (float("inf") if self._quiet else self._peek), head

    def _admit(self, head, j: int, t: float, rem: list, pre: list, n_out: int, bound) -> tuple:
        """The schedule of step ``j + 1`` (at ``t``, after step ``j``'s update): admit the ready heads of the queue
        while the batch has room and the pools can give their prefill's staging (``Scheduler.schedule``: FCFS,
        nobody overtakes the head); each joins the prefills, in admission order. Returns the new head, ``nxt`` and
        the blocked head (None); a head the schedule would reject ends the stretch before this step (nxt = t).
        ``bound``: ``_bound(j)`` (None: none), the levels computed only where it cannot tell."""
        sched = self.eng.sched
        acct, waitq = sched.acct, sched.waiting
        lvl = None  # the levels after step j's update, with this schedule's admissions
        added = 0.0  # this schedule's admissions' staging
        hbm = self.hbm
        if hbm is not None:  # (whole bytes: the same float as hbm.at(j) after each admission)
            level = hbm.at(j)
        while head is not None and head.ready_t <= t:
            if sched.max_batch is not None and len(sched.running) - n_out + self.n_adm >= sched.max_batch:
                return head, (float("inf") if self._quiet else self._peek), head
            # (never preempted: its prefill target is the prompt, which add() checked)
            if head.prefill_done >= head.prefill_target or (
                head.preempted and sched._never_fits(head, final=False) is not None
            ):
                return head, t, None  # rejected (or nothing to prefill): the engine's schedule takes it
            gpu, host = acct.need(head, head.prefill_target, staging=True)
            if hbm is not None and not host:  # (level counts this schedule's admissions)
                if gpu > 0 and gpu > acct.hbm.capacity - level:
                    return head, (float("inf") if self._quiet else self._peek), head
            elif lvl is None and bound is not None and not host and bound + gpu <= acct.hbm.capacity:
                bound += gpu  # fits below the bound (and nothing on the host)
            else:
                if lvl is None:
                    g, h = self._level(j)
                    lvl = [g + added, h]  # (the bound admits only requests with nothing on the host)
                if (gpu > 0 and gpu > acct.hbm.capacity - lvl[0]) or (host > 0 and host > acct.host.capacity - lvl[1]):
                    return head, (float("inf") if self._quiet else self._peek), head
                lvl[0] += gpu
                lvl[1] += host
            rec = [head, 0, None, None, j + 1, (gpu, host)]
            pre.append(rec)
            self.recs.append(rec)
            rem.append(head.prefill_target - head.prefill_done)
            self.staged += gpu
            added += gpu
            if hbm is not None:
                hbm.base += gpu
                level += gpu
            self.n_adm += 1
            head = waitq[self.n_adm] if len(waitq) > self.n_adm else None
        nxt, _ = self._head_events(head, t)
        return head, nxt, None

    def _prefill_step(self, pre, rem, n_dec, ctx_tokens, t, starts, durs, n_decs, n_pfs):
        """One step with prefill chunks (``Scheduler.schedule``'s: ``chunk_tokens`` shared in admission order,
        from ``pre[p0]`` on); returns its end, the batch's context after it and the requests whose prefill it ends."""
        chunks, joined = [], []
        budget = self.chunk
        n_pf = 0
        i, n_pre = self.p0, len(pre)
        while budget > 0 and i < n_pre:
            x = rem[i]
            if x <= 0:
                i += 1
                continue
            n = x if x < budget else budget
            rec = pre[i]
            chunks.append((n, rec[0].prefill_target - x))
            rem[i] = x - n
            budget -= n
            n_pf += n
            if x == n:
                joined.append(rec)
                i += 1
        self.p0 = i
        d = self._step_s(n_dec, ctx_tokens, chunks, n_pf)
        starts.append(t)
        durs.append(d)
        n_decs.append(n_dec)
        n_pfs.append(n_pf)
        return t + d, ctx_tokens + n_dec, joined

    def _decode_steps(self, n_dec, ctx_tokens, count, t, nxt, first, starts, durs, head) -> float:
        """Up to ``count`` decode-only steps of ``n_dec`` requests holding ``ctx_tokens`` tokens (one more a request
        each step), those that start before ``nxt`` (``first``: the first whatever comes); returns the end of the last. ``_step_s`` with the decode
        attention as a line in the batch's context (``attn_decode`` is linear in its bytes at a given batch for every
        predictor)."""
        eng = self.eng
        pred, bpt = eng.pred, self.bpt_layer
        waiting = head is not None and head.ready_t <= t  # (head: the queue's, after the stretch's admissions)
        a0 = pred.time("attn_decode", {"kv_bytes": ctx_tokens * bpt, "requests": n_dec})
        memo = self._dec_memo[waiting]
        v = memo.get(n_dec)
        if v is None:
            da = pred.time("attn_decode", {"kv_bytes": n_dec * bpt, "requests": n_dec})
            c = eng._per_token(n_dec)  # (+ 0.0 prefill attention: _step_s's c, the same float)
            chain = eng.chain_max if eng.chain_max > 1 and n_dec and not waiting else 1
            v = memo[n_dec] = (da, c, *self._head_tail(chain, n_dec), eng._step_floor(n_dec))
        da, c, head, tail, floor = v
        L = eng.L
        i = 0
        while i < count and (t < nxt or first and not i):
            g = head + L * (c + (a0 + i * da)) + tail  # (i = 0: _step_s's figure exactly)
            d = g if g > floor else floor
            starts.append(t)
            durs.append(d)
            t += d
            i += 1
        return t

    # -- the pools -----------------------------------------------------------------------------------------------
    def _level(self, m: int) -> tuple:
        """The (HBM, host) pools' levels after the stretch's step ``m``'s update: every request holds what its
        context then needs (a prefill: what it held, or its staging from the step whose schedule admitted it),
        those ended by then nothing."""
        g, h = self.lvl0
        pb = self.block_bytes
        if pb is not None:  # HBM a whole block at a time, nothing on the host (ByteAccounting.need, no windows)
            bs = self.bs
            for r, c0, s, f, a, st in self.recs:
                if a > m:
                    continue
                if f is not None and f <= m:
                    g -= r.gpu_held
                    h -= r.host_held
                elif s is not None and s <= m:
                    g += -(-(c0 + m) // bs) * pb - r.gpu_held
                elif a:
                    g += st[0]
                    h += st[1]
            return g, h
        need = self.eng.sched.acct.need
        for r, c0, s, f, a, st in self.recs:
            if a > m:
                continue
            if f is not None and f <= m:
                g -= r.gpu_held
                h -= r.host_held
            elif s is not None and s <= m:
                gpu, host = need(r, c0 + m, staging=False)
                g += gpu - r.gpu_held
                h += host - r.host_held
            elif a:
                g += st[0]
                h += st[1]
        return g, h

    def _levels(self, m: int) -> tuple:
        """The levels at step ``m``'s update: just before its ends free (the step's admissions in), and after it
        (``_level(m)``)."""
        g, h = self.lvl0
        g1, h1 = g, h
        pb = self.block_bytes
        need = self.eng.sched.acct.need
        bs = self.bs
        for r, c0, s, f, a, st in self.recs:
            if a > m:
                continue
            if f is not None and f < m:
                g -= r.gpu_held
                h -= r.host_held
                g1 -= r.gpu_held
                h1 -= r.host_held
                continue
            if s is not None and s < m:  # before the update: as grown at step m - 1
                if pb is not None:
                    g += -(-(c0 + m - 1) // bs) * pb - r.gpu_held
                else:
                    gpu, host = need(r, c0 + m - 1, staging=False)
                    g += gpu - r.gpu_held
                    h += host - r.host_held
            elif a:
                g += st[0]
                h += st[1]
            if f == m:
                g1 -= r.gpu_held
                h1 -= r.host_held
            elif s is not None and s <= m:
                if pb is not None:
                    g1 += -(-(c0 + m) // bs) * pb - r.gpu_held
                else:
                    gpu, host = need(r, c0 + m, staging=False)
                    g1 += gpu - r.gpu_held
                    h1 += host - r.host_held
            elif a:
                g1 += st[0]
                h1 += st[1]
        return (g, h), (g1, h1)

    def _fits_at(self, m: int, n_grow: int) -> bool:
        """Whether the pools can give the growth up to step ``m`` of the ``n_grow`` requests that decode by then:
        at once where a block is a constant (each grows by at most ``ceil(m / block_size)`` blocks: a bound), else
        from the levels."""
        bound = self._bound(m, n_grow, 0.0)
        if bound is not None and bound <= self.eng.sched.acct.hbm.capacity:
            return True
        return self._fits(self._level(m))

    def _fits(self, lvl) -> bool:
        acct = self.eng.sched.acct
        return lvl[0] <= acct.hbm.capacity and lvl[1] <= acct.host.capacity

    def _last_fitting(self, last_free: int, hi: int) -> int:
        """The last step up to ``hi`` whose levels fit: the levels grow from ``last_free`` (the last step that ended
        requests) on, and fit just before it (before any, the levels now fit)."""
        lo = last_free - 1 if last_free else 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._fits(self._level(mid)):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _admits(self, head, m: int, levels, freed: float, running: int) -> bool:
        """Whether ``Scheduler.schedule`` would admit the waiting ``head`` after the stretch's step ``m`` (its
        ``levels``, computed here if None and needed), with ``running`` requests running and the ends having freed
        ``freed`` bytes of HBM (holdings only grow meanwhile: the head cannot fit in more than that)."""
        sched = self.eng.sched
        if sched.max_batch is not None and running >= sched.max_batch:
            return False
        acct = sched.acct
        gpu, host = acct.need(head, head.prefill_target, staging=True)
        if self.block_bytes is not None and gpu > acct.hbm.capacity - (self.lvl0[0] - freed + self.staged):
            return False
        lvl = self._levels(m)[1] if levels is None else levels[1]
        return not (gpu > acct.hbm.capacity - lvl[0] or host > acct.host.capacity - lvl[1])

    def _bound(self, m: int, n_grow: int, freed: float):
        """An upper bound of the HBM level after step ``m`` where a block is a constant (else None): each of the
        ``n_grow`` requests decoding by then holds at most ``ceil(m / block_size)`` blocks more: ``m`` tokens more than
        the context it holds (a decoding request) or its prefill target (one whose prefill ends in the stretch), and
        those the stretch admitted their staging."""
        pb = self.block_bytes
        if pb is None:
            return None
        return self.lvl0[0] - freed + self.staged + pb * n_grow * -(-m // self.bs)

    def _apply(self, k: int, starts: list, durs: list, part, frees) -> None:
        """Every request, the engine's counters and step times, and the pools, as ``k`` steps of the exact path;
        ``part``: (i, its remaining tokens) of the prefill ``i`` begun after step ``k`` (-1: none; the others still
        prefilling have not begun)."""
        eng = self.eng
        sched = eng.sched
        grown, joined, staged = [], [], []
        recs, n0 = self.recs, self.n_dec0
        # admitted by the stretch's schedules up to step k: out of the queue into the batch, as Scheduler.schedule
        # (their memory below, with the others')
        for rec in recs[len(recs) - self.n_adm :]:
            a = rec[4]
            if a > k:
                break
            r = sched.waiting.popleft()
            r.state = PREFILL
            at_t = starts[a - 1]
            if r.admit_t is None:
                r.admit_t = at_t
            sched._seq += 1
            r.seq = sched._seq
            sched.running[r.id] = r
            if sched.on_admit is not None:
                sched.on_admit(r, at_t)
        recs = [rec for rec in recs if rec[4] <= k]
        fk = float(k)
        decoded = 0  # request-steps that decoded
        for rec in recs[:n0]:  # decoding from the start
            r, c0, _, f = rec[:4]
            if f > k:
                r.generated += k
                r.recall_sum += fk
                r.recall_n += k
                grown.append((r, c0 + k))
            else:
                r.generated += f
                r.recall_sum += float(f)
                r.recall_n += f
                decoded += f - k
        decoded += k * n0
        part_i, part_rem = part
        for i, rec in enumerate(recs[n0:]):  # prefilling at the start
            r, c0, s, f = rec[:4]
            if s is None or s > k:  # still prefilling: its chunks of the stretch
                if i == part_i:
                    r.prefill_done = r.prefill_target - part_rem
                if rec[4]:
                    staged.append(rec)
                continue
            r.prefill_done = r.prefill_target  # its prefill ended at step s
            r.state = DECODE
            if not r.generated:
                r.generated = 1
                r.first_token_t = starts[s - 1] + durs[s - 1]
            joined.append(r)
            steps = (f if f <= k else k) - s
            r.generated += steps
            r.recall_sum += float(steps)
            r.recall_n += steps
            decoded += steps
            if f > k:
                grown.append((r, c0 + k))
        # as Scheduler.update: at each step, those that emitted their last token end (the decoded in admission
        # order, then those whose prefill ended there), then the rest grow
        for f, out, _ in frees:
            out.sort(key=lambda rec: (rec[2] == f, rec[0].seq))
            for rec in out:
                sched.finish(rec[0], starts[f - 1] + durs[f - 1])
        acct = sched.acct
        for rec in staged:  # admitted and still prefilling: their staging (after the ends: the levels only grow)
            r, (gpu, host) = rec[0], rec[5]
            if not sched._resize(r, gpu, host):
                raise AssertionError(f"WholeKVStretch: request {r.id}'s staging does not fit")
        sched.grow_fitting(grown)
        for _, _, lvl in frees:  # the levels just before each step's ends: the pools' peaks (None: not above)
            if lvl is not None:
                acct.hbm.peak = max(acct.hbm.peak, lvl[0])
                acct.host.peak = max(acct.host.peak, lvl[1])
        sched.step += k - 1  # (the schedule counted the plan's step)
        for r in joined:
            if r.state == DECODE:
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
        self.recs = None
