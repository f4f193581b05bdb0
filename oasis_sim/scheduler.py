"""The simulator's side of the one scheduler (``oasis_core.scheduler``): its request state and its accounting in
bytes of the decode node's HBM and host pools.

Memory per request (bytes; ``ctx`` = tokens held, rounded up to whole blocks; sizes from ``KVGeometry``):

- modes with the whole KV on the GPU (``dense``, ``quest``): HBM ``ctx × bytes_per_token``; host nothing.
- sparse modes (``retrieval``, ``proxy``, ``lookahead``): HBM = resident set (``(K+1)`` blocks per layer and KV
  head) + block summaries of ``ctx`` + draft state, plus the whole prefill target's KV while it is being prefilled
  (staging, released when prefill ends and the KV sits in host DRAM); host DRAM ``ctx × bytes_per_token`` (with
  ``split=rpf`` only what crossed the network plus the tokens decoded here; with ``host_kv_dtype="fp8_e4m3"``
  ``host_bytes_per_block`` a block: one byte an element plus the scales).
- short contexts (``SimConfig.short_context``, ``oasis_core.short_context``): a sparse-mode request with at most
  ``(K+1) × block_size`` tokens is resident-dense and is held as in ``dense`` (HBM ``ctx × bytes_per_token``, host
  nothing, while prefilling too); from the step it outgrows that, the sparse-mode holdings above.
- hybrid models (``ModelSpec.layer_windows``): ``bytes_per_token`` above is the full layers' (``KVGeometry.
  full_bytes_per_token``) and the resident set, summaries and host copy count full layers only; every request
  also holds its windowed layers' rings on the GPU, ``min(ctx, W)`` tokens a layer (``KVGeometry.window_bytes``),
  in every mode.
"""

from __future__ import annotations

from oasis_core import modes
from oasis_core.echo import show
from oasis_core.geometry import KVGeometry
from oasis_core.scheduler import COMPLETED, DECODE, PREFILL, Request, Scheduler

from .config import SimConfig
from .hardware import MemoryPool


class Req(Request):
    """One request of the simulation: the core's scheduling state plus what the simulator measures."""

    __slots__ = (
        "arrival",
        "prefix_ids",
        "prefix_block_tokens",
        "policy",
        "fetch_blocks",
        "recall_sum",
        "recall_n",
        "stall_s",
        "prefix_hit_tokens",
        "net_bytes",
        "h2d_bytes",
        "held_key",
        "due",
        "steady",
    )

    def __init__(self, id, arrival, prompt, output, prefix_ids=None, prefix_block_tokens=None):
        super().__init__(id=id, prompt_len=int(prompt), max_tokens=int(output), ready_t=arrival)
        self.arrival = arrival
        self.prefix_ids, self.prefix_block_tokens = prefix_ids, prefix_block_tokens
        self.policy = None
        self.fetch_blocks = 0.0  # (block, head) slices fetched for this request
        self.recall_sum = 0.0
        self.recall_n = 0
        self.stall_s = 0.0
        self.prefix_hit_tokens = 0
        self.net_bytes = 0.0
        self.h2d_bytes = 0.0
        self.held_key = None  # (blocks, gpu_held, host_held) after the last growth (SimScheduler._grow)
        self.due = None  # SimScheduler's crossing bucket: step residue at which its block count changes
        self.steady = None  # SimEngine's: on its profile's tail, its figures a step counted in arrears (_settle)

    @property
    def prompt(self) -> int:
        return self.prompt_len

    @property
    def output(self) -> int:
        return self.max_tokens


class ByteAccounting:
    """``oasis_core.scheduler.Accounting`` in bytes of the node's HBM (GPU) and host DRAM pools."""

    def __init__(self, cfg: SimConfig, geo: KVGeometry, hbm: MemoryPool, host: MemoryPool):
        self.geo, self.hbm, self.host = geo, hbm, host
        self.bs = cfg.block_size
        self.bpt = geo.full_bytes_per_token  # bytes_per_token without windows
        self.hybrid = geo.model.is_hybrid
        self.host_block = geo.host_bytes_per_block(cfg.host_kv_dtype)  # a block's host copy (fp8: half, + scales)
        self.sparse = modes.get(cfg.mode).sparse
        self.fixed_hbm = (geo.resident_bytes(cfg.resident_slots) + cfg.draft_state_bytes) if self.sparse else 0.0
        self.rpf = cfg.split == "rpf"
        self.short = cfg.short_context_rule  # None: every request of a sparse mode is held sparse
        self.lane_bytes = None
        self.short_window = self.short.window_tokens if self.short is not None else -1
        self._memo: dict = {}  # (blocks, staging, resident-dense) -> need(): block-granular, the request unused

    @property
    def lane_bytes(self):
        """SimConfig.kv_budget_gb (engine oasis): a whole lane a request, as the executor's (None: bytes as held)."""
        return self._lane_bytes

    @lane_bytes.setter
    def lane_bytes(self, v) -> None:
        self._lane_bytes = v
        self._memo = {}  # need()'s, by block count: lanes change it
        # what each block adds to a request's HBM holdings where that is a constant (the whole KV on the GPU, no
        # windows, no lanes; nothing on the host then), else None
        self.block_bytes = (
            None if self.sparse or self.hybrid or self.rpf or v is not None else self.geo.dense_bytes(self.bs)
        )

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def need(self, r: Req, tokens: int, *, staging: bool) -> tuple:
        """(HBM, host) bytes; a function of the block count, the staging flag and the short-context rule alone
        (memoised) except with ``split=rpf`` (the bytes that crossed the network)."""
        if self.rpf:
            return self._need(r, tokens, staging)
        key = (-(-tokens // self.bs), staging, tokens <= self.short_window)
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = self._need(r, tokens, staging)
        return v

    def _need(self, r: Req, tokens: int, staging: bool) -> tuple:
        bs, bpt = self.bs, self.bpt
        if self.lane_bytes is not None:
            host = self._blocks(tokens) * self.host_block if self.sparse else 0.0
            return self.lane_bytes, host
        if not self.sparse or (self.short is not None and self.short.dense(tokens)):
            return self.geo.dense_bytes(self._blocks(tokens) * bs), 0.0
        hbm = self.fixed_hbm + self._blocks(tokens) * self.geo.rows_per_request * self.geo.summary_bytes_per_block_head
        if self.hybrid:  # the windowed layers' rings stay on the GPU
            hbm += self.geo.window_bytes(self._blocks(tokens) * bs)
        if staging:
            hbm += self._blocks(tokens) * bs * bpt
        if self.rpf:  # only what crossed the network, plus the tokens decoded here
            return hbm, r.net_bytes + self._blocks(max(0, tokens - r.prompt_len)) * bs * bpt
        return hbm, self._blocks(tokens) * self.host_block

    def capacity(self) -> tuple:
        return self.hbm.capacity, self.host.capacity

    def resize(self, r: Req, hbm: float, host: float) -> bool:
        dh, dx = hbm - r.gpu_held, host - r.host_held
        if (dh > 0 and dh > self.hbm._capacity - self.hbm._level) or (
            dx > 0 and dx > self.host._capacity - self.host._level
        ):
            return False
        if dh > 0:
            self.hbm.try_reserve(dh)
        elif dh < 0:
            self.hbm.release(-dh)
        if dx > 0:
            self.host.try_reserve(dx)
        elif dx < 0:
            self.host.release(-dx)
        return True


class SimScheduler(Scheduler):
    """The core scheduler with the simulator's hooks: policy handles at admission, the requests that ended, RPF
    host growth."""

    def __init__(self, cfg: SimConfig, geo: KVGeometry, hbm: MemoryPool, host: MemoryPool, policy_source=None):
        max_ctx = cfg.max_context if cfg.max_context is not None else cfg.model_spec.max_context_tokens
        super().__init__(
            accounting=ByteAccounting(cfg, geo, hbm, host),
            prefill_tokens=cfg.chunk_tokens,
            max_batch=cfg.max_batch,
            max_context=max_ctx,
            on_admit=self._admitted,
            on_end=self._ended,
        )
        self.bs = cfg.block_size
        self.rpf = cfg.split == "rpf"
        self.policy_source = policy_source if cfg.sparse else None  # (PolicySource gives a sparse mode's only)
        self.done: list[Req] = []  # completed
        self.rejected: list[Req] = []
        self.host_overflow = 0
        self.on_done = None  # callback(req, now) when a request ends (closed-loop workloads)
        # _grow_all's crossing buckets: residue of the step mod block_size -> {id: request}
        self._bucketed = not self.rpf and not cfg.spec_max_k and self.decode_with_prefill
        self._due = [{} for _ in range(self.bs)]
        self._pending: list = []  # admitted already decoding: grown at their first update

    def update(self, plan, now: float = 0.0, stopped=(), emitted=None) -> list:
        """The core's ``update`` (``oasis_core.scheduler``); a step in which every decode emitted one token and none
        stopped (every simulated step but a speculative one) takes one loop over the decodes: a token each, the
        completed in ``plan.decode``'s order, then those whose prefill ended, as the core's list."""
        if stopped or emitted:
            return super().update(plan, now, stopped, emitted)
        finished_prefill = []
        for c in plan.prefill:
            r = c.req
            if r.state != PREFILL:
                continue
            r.prefill_done += c.n
            if r.prefill_done >= r.prefill_target:
                if r.generated == 0:
                    r.generated = 1
                    r.first_token_t = now
                r.state = DECODE
                finished_prefill.append(r)
        done = []
        for r in plan.decode:
            if r.state != DECODE:
                continue
            g = r.generated = r.generated + 1
            if r.first_token_t is None:  # a synthesized prefill: the first decode yields the first token
                r.first_token_t = now
            if g >= r.max_tokens:
                if g > r.max_tokens:
                    raise ValueError(
                        f"Scheduler.update: request {show(r.id)} emitted 1 tokens; must be 1 .. "
                        f"{r.max_tokens - g + 1} (max_tokens {r.max_tokens}, {g - 1} generated)"
                    )
                done.append(r)
        for r in finished_prefill:
            if r.generated >= r.max_tokens:
                done.append(r)
        for r in done:
            del self.running[r.id]
            self._free(r)
            self._end(r, COMPLETED, "length", now)
        self._grow_all(finished_prefill, plan.decode)  # (it grows those still decoding: the decoded)
        return done

    def ensure_policy(self, r: Req) -> None:
        """Give ``r`` its policy handle (sized by its mean context: prompt + half the output)."""
        if r.policy is None and self.policy_source is not None:
            r.policy = self.policy_source.for_request(r.id, -(-(r.prompt_len + (r.max_tokens + 1) // 2) // self.bs))

    def regrow_host(self, r: Req) -> None:
        """RPF: host bytes follow what has arrived; beyond the pool the excess is counted, not preempted."""
        _, host = self.acct.need(r, r.ctx, staging=False)
        if not self._resize(r, r.gpu_held, host):
            self.host_overflow += 1

    def _grow_all(self, finished_prefill, decoded) -> None:
        """The core's growth loop, visiting only the requests whose need may have changed. A decoding request's block
        count changes when its context reaches ``m · block_size + 1``; while it decodes one token a step, its
        context minus the scheduler's step count is fixed (a fast-forwarded stretch adds ``k`` to both), so that
        happens at steps of one residue mod ``block_size``: ``_due[residue]`` holds it. Visited: those that finished
        their prefill (first), then those admitted already decoding (``decode_only``) and the due ones, in admission
        order (``seq``: ``plan.decode``'s order), as the core's loop would reach them; a request whose blocks and
        holdings did not move would do nothing there. Not bucketed (every request visited, the skip inlined):
        ``split=rpf`` (host need follows the network), speculative decoding (several tokens a step)."""
        if not self._bucketed:
            bs = self.bs
            for r in (*finished_prefill, *decoded):
                if r.state != DECODE:
                    continue
                g = r.generated - (r.prefill_target - r.prompt_len)  # Request.ctx, inlined
                key = r.held_key
                if (
                    key is not None
                    and key[0] == -(-(r.prefill_done + (g if g > 0 else 0)) // bs)
                    and key[1] == r.gpu_held
                    and key[2] == r.host_held
                ):
                    continue
                self._grow(r)
            return
        bs, step = self.bs, self.step
        for r in finished_prefill:
            if r.state == DECODE:
                self._grow(r)
                self._register(r)
        res = step % bs
        bucket = self._due[res]
        visit = self._pending
        self._pending = []
        if bucket:
            stale = [i for i, r in bucket.items() if r.state != DECODE or r.due != res]
            for i in stale:
                del bucket[i]
            visit = visit + list(bucket.values()) if visit else list(bucket.values())
        if not visit:
            return
        if len(visit) > 1:
            visit.sort(key=lambda r: r.seq)
        acct = self.acct
        hbm, host = acct.hbm, acct.host
        if hbm.get_queue or hbm.put_queue or host.get_queue or host.put_queue:  # (a process waits on a pool)
            self._grow_each(visit)
            return
        # _grow for each, the pools' levels and peaks kept here, move by move as try_reserve / release move them
        # (the same figures), and noted once: one point a time in their series either way
        need = acct.need
        g_lvl, g_cap, g_peak, h_lvl, h_cap, h_peak = (
            hbm._level,
            hbm._capacity,
            hbm.peak,
            host._level,
            host._capacity,
            host.peak,
        )
        g_moved = h_moved = False
        for i, r in enumerate(visit):
            if r.state != DECODE:
                continue
            g = r.generated - (r.prefill_target - r.prompt_len)  # Request.ctx, inlined
            ctx = r.prefill_done + (g if g > 0 else 0)
            blocks = -(-ctx // bs)
            key = r.held_key
            if key is None or key[0] != blocks or key[1] != r.gpu_held or key[2] != r.host_held:
                gpu, hst = need(r, ctx, staging=False)
                dh, dx = gpu - r.gpu_held, hst - r.host_held
                if (dh > 0 and dh > g_cap - g_lvl) or (dx > 0 and dx > h_cap - h_lvl):  # preempts: the core's way
                    hbm._level, hbm.peak, host._level, host.peak = g_lvl, g_peak, h_lvl, h_peak
                    if g_moved:
                        hbm._note()
                    if h_moved:
                        host._note()
                    self._grow_each(visit[i:])
                    return
                if dh > 0:
                    g_lvl += dh
                    g_moved = True
                elif dh < 0:
                    g_lvl -= min(-dh, g_lvl)
                    g_moved = True
                if g_lvl > g_peak:
                    g_peak = g_lvl
                if dx > 0:
                    h_lvl += dx
                    h_moved = True
                elif dx < 0:
                    h_lvl -= min(-dx, h_lvl)
                    h_moved = True
                if h_lvl > h_peak:
                    h_peak = h_lvl
                r.gpu_held, r.host_held = gpu, hst
                r.held_key = (blocks, gpu, hst)
            if r.due is None:
                self._register(r)
        hbm._level, hbm.peak, host._level, host.peak = g_lvl, g_peak, h_lvl, h_peak
        if g_moved:
            hbm._note()
        if h_moved:
            host._note()

    def _grow_each(self, reqs) -> None:
        for r in reqs:
            if r.state == DECODE:
                self._grow(r)
                if r.due is None:
                    self._register(r)

    def _register(self, r: Req) -> None:
        """Put a request that just decoded in the bucket of the steps at which its block count changes."""
        res = (1 - r.ctx + self.step) % self.bs
        if r.due is not None and r.due != res:
            self._due[r.due].pop(r.id, None)
        r.due = res
        self._due[res][r.id] = r

    def _grow(self, r: Req) -> None:
        """The core's growth, skipped when nothing it depends on moved since the last: the same blocks and the same
        holdings give the same need (block-granular in every mode; not with split=rpf, whose host need follows the
        bytes that arrived)."""
        if self.rpf:
            return super()._grow(r)
        g = r.generated - (r.prefill_target - r.prompt_len)  # Request.ctx, inlined
        blocks = -(-(r.prefill_done + (g if g > 0 else 0)) // self.bs)
        key = r.held_key
        if key is not None and key[0] == blocks and key[1] == r.gpu_held and key[2] == r.host_held:
            return
        gpu, host = self.acct.need(r, r.prefill_done + (g if g > 0 else 0), staging=False)
        if gpu != r.gpu_held or host != r.host_held:
            if self.acct.resize(r, gpu, host):  # the core's _resize, inlined (the hot path)
                r.gpu_held, r.host_held = gpu, host
            else:
                super()._grow(r)  # preempts until it fits
        r.held_key = (blocks, r.gpu_held, r.host_held)

    def grow_fitting(self, pairs) -> None:
        """``_grow`` each decoding request of ``pairs`` ``[(request, ctx)]`` to hold what ``ctx`` tokens need, when
        their growth together is known to fit (a fast-forwarded stretch checked it): each request's holdings as
        ``_grow`` would set them, the pools moved once by the sum (whole bytes: the same levels)."""
        need, bs, pb = self.acct.need, self.bs, self.acct.block_bytes
        dg = dh = 0.0
        for r, ctx in pairs:
            blocks = -(-ctx // bs)
            key = r.held_key
            if key is not None and key[0] == blocks and key[1] == r.gpu_held and key[2] == r.host_held:
                continue
            gpu, host = (blocks * pb, 0.0) if pb is not None else need(r, ctx, staging=False)
            dg += gpu - r.gpu_held
            dh += host - r.host_held
            r.gpu_held, r.host_held = gpu, host
            if not self.rpf:
                r.held_key = (blocks, gpu, host)
        acct = self.acct
        for pool, d in ((acct.hbm, dg), (acct.host, dh)):
            if d > 0:
                if not pool.try_reserve(d):
                    raise AssertionError(f"SimScheduler.grow_fitting: {pool.name} cannot give {d} bytes")
            elif d < 0:
                pool.release(-d)

    def finish(self, r: Req, now: float) -> None:
        """End ``r``, whose last token a fast-forwarded stretch emitted, as ``update`` ends a completed request."""
        del self.running[r.id]
        self._free(r)
        self._end(r, COMPLETED, "length", now)

    def _admitted(self, r: Req, now: float) -> None:
        self.ensure_policy(r)
        r.due = None  # (re)admitted: its next growth is visited, then it is bucketed again
        if self._bucketed and r.state == DECODE:  # admitted already decoding (decode_only): its first update grows it
            self._pending.append(r)

    def _ended(self, r: Req, now: float) -> None:
        (self.done if r.state == COMPLETED else self.rejected).append(r)
        if self.on_done is not None:
            self.on_done(r, now)
