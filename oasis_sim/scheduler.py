"""Continuous batching: FCFS admission limited by HBM and host DRAM, chunked prefill, preemption by recomputation.

Memory per request (bytes; ``ctx`` = tokens held, rounded up to whole blocks):

- ``dense`` / ``quest``: HBM ``ctx × bytes_per_token``; host nothing.
- sparse modes (``retrieval``, ``proxy``, ``lookahead``): HBM = resident set (``(K+1)`` blocks per layer and KV
  head) + block summaries of ``ctx`` + draft state, plus the whole prompt's KV while it is being prefilled (staging,
  released when prefill ends and the KV sits in host DRAM); host DRAM ``ctx × bytes_per_token``.

Admission is FCFS: the head of the waiting queue is admitted when its prompt fits (both pools) and the batch has
room; nobody overtakes it. Memory grows a block at a time during decode; when a pool cannot grow, the most recently
admitted request is preempted (its memory freed, it returns to the front of the queue and later re-prefills its
prompt plus the tokens it had generated; counted in ``preemptions``).

The three-call step: ``plan = scheduler.schedule(now)``, ``result = backend.execute(plan)``,
``scheduler.update(plan, result)``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from oasis_core.geometry import KVGeometry

from .config import SimConfig
from .hardware import MemoryPool


class Req:
    """Mutable state of one request in the simulation."""

    __slots__ = ("id", "arrival", "prompt", "output", "prefix_ids", "prefix_block_tokens", "state", "prefill_done",
                 "prefill_target", "generated", "first_token_t", "finish_t", "admit_t", "preempted", "hbm", "host",
                 "policy", "fetch_blocks", "recall_sum", "recall_n", "stall_s", "prefix_hit_tokens", "net_bytes",
                 "h2d_bytes", "staging", "seq", "ready_t")

    def __init__(self, id, arrival, prompt, output, prefix_ids=None, prefix_block_tokens=None):
        self.id, self.arrival, self.prompt, self.output = id, arrival, prompt, output
        self.prefix_ids, self.prefix_block_tokens = prefix_ids, prefix_block_tokens
        self.state = "waiting"  # waiting | prefill | decode | done
        self.prefill_done = 0  # tokens of prefill_target already computed
        self.prefill_target = prompt  # prompt (+ tokens generated before a preemption)
        self.generated = 0
        self.first_token_t = None
        self.finish_t = None
        self.admit_t = None
        self.preempted = 0
        self.hbm = 0.0  # bytes held
        self.host = 0.0
        self.staging = 0.0  # HBM bytes of the prompt KV held while prefilling (sparse modes)
        self.policy = None
        self.fetch_blocks = 0.0  # (block, head) slices fetched for this request
        self.recall_sum = 0.0
        self.recall_n = 0
        self.stall_s = 0.0
        self.prefix_hit_tokens = 0
        self.net_bytes = 0.0
        self.h2d_bytes = 0.0
        self.seq = 0  # admission order (preemption victim = largest)
        self.ready_t = arrival  # when it may be admitted (split: after hand-off)

    @property
    def ctx(self) -> int:
        """Tokens whose KV exists (prefilled part + generated beyond the prefill target)."""
        return self.prefill_done + max(0, self.generated - (self.prefill_target - self.prompt))


@dataclass
class BatchPlan:
    """What one engine step computes: one token for each decode request, a chunk for each prefill entry."""

    decode: list = field(default_factory=list)  # [Req]
    prefill: list = field(default_factory=list)  # [(Req, n_tokens)]

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


class Scheduler:
    def __init__(self, cfg: SimConfig, geo: KVGeometry, hbm: MemoryPool, host: MemoryPool, weights_bytes: float,
                 policy_source=None):
        self.cfg = cfg
        self.geo = geo
        self.hbm = hbm
        self.host = host
        self.policy_source = policy_source
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.done: list[Req] = []
        self.preemptions = 0
        self._seq = 0
        self.bs = cfg.block_size
        self.bpt = geo.bytes_per_token
        self.sparse = cfg.sparse
        self.fixed_hbm = (geo.resident_bytes(cfg.top_k) + cfg.draft_state_bytes) if self.sparse else 0.0
        self.hbm_reserved_weights = weights_bytes
        self.rpf = cfg.split == "rpf"
        self.host_overflow = 0
        self.on_done = None  # callback(req) (closed-loop workloads, split bookkeeping)

    # -- memory per request -------------------------------------------------------------------------------------
    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def hbm_need(self, tokens: int, staging_tokens: int = 0) -> float:
        if not self.sparse:
            return self._blocks(tokens) * self.bs * self.bpt
        return (self.fixed_hbm + self._blocks(tokens) * self.geo.rows_per_request * self.geo.summary_bytes_per_block_head
                + self._blocks(staging_tokens) * self.bs * self.bpt)

    def host_need(self, tokens: int, r: Req | None = None) -> float:
        if not self.sparse:
            return 0.0
        if self.rpf and r is not None:  # only what crossed the network, plus the tokens decoded here
            return r.net_bytes + self._blocks(max(0, tokens - r.prompt)) * self.bs * self.bpt
        return self._blocks(tokens) * self.bs * self.bpt

    def regrow_host(self, r: Req) -> None:
        """RPF: host bytes follow what has arrived; beyond the pool the excess is counted, not preempted."""
        if not self._resize(r, r.hbm, self.host_need(r.ctx, r)):
            self.host_overflow += 1

    def _resize(self, r: Req, hbm: float, host: float) -> bool:
        """Grow/shrink ``r``'s holdings to the given bytes; False (and nothing changed) when a pool is full."""
        dh, dx = hbm - r.hbm, host - r.host
        if dh > 0 and dh > self.hbm.free:
            return False
        if dx > 0 and dx > self.host.free:
            return False
        if dh > 0:
            self.hbm.try_reserve(dh)
        elif dh < 0:
            self.hbm.release(-dh)
        if dx > 0:
            self.host.try_reserve(dx)
        elif dx < 0:
            self.host.release(-dx)
        r.hbm, r.host = hbm, host
        return True

    def _free(self, r: Req) -> None:
        self._resize(r, 0.0, 0.0)
        r.staging = 0.0

    def ensure_policy(self, r: Req) -> None:
        """Give ``r`` its policy handle (sized by its mean context: prompt + half the output)."""
        if r.policy is None and self.policy_source is not None:
            r.policy = self.policy_source.for_request(r.id, self._blocks(r.prompt + (r.output + 1) // 2))

    # -- the three calls ------------------------------------------------------------------------------------------
    def add(self, r: Req) -> None:
        self.waiting.append(r)

    def schedule(self, now: float) -> BatchPlan:
        cfg = self.cfg
        # FCFS admission.
        while self.waiting and len(self.running) < cfg.max_batch:
            r = self.waiting[0]
            if r.ready_t > now:
                break
            target = r.prefill_target
            need_hbm = self.hbm_need(target, staging_tokens=target if self.sparse else 0)
            if not self._resize(r, need_hbm, self.host_need(target, r)):
                break
            self.waiting.popleft()
            r.state = "prefill" if r.prefill_done < target else "decode"
            r.staging = need_hbm if self.sparse else 0.0
            r.admit_t = now if r.admit_t is None else r.admit_t
            self._seq += 1
            r.seq = self._seq
            self.ensure_policy(r)
            self.running.append(r)
        plan = BatchPlan()
        budget = cfg.chunk_tokens
        for r in self.running:
            if r.state == "decode":
                plan.decode.append(r)
            elif budget > 0:
                n = min(budget, r.prefill_target - r.prefill_done)
                plan.prefill.append((r, n))
                budget -= n
        return plan

    def update(self, plan: BatchPlan, now: float) -> list[Req]:
        """Advance token counts after a step that ended at ``now``; returns requests that finished prefill."""
        finished_prefill = []
        for r, n in plan.prefill:
            r.prefill_done += n
            if r.prefill_done >= r.prefill_target:
                if r.generated == 0:
                    r.generated = 1  # the prefill's last position yields the first output token
                    r.first_token_t = now
                r.state = "decode"
                finished_prefill.append(r)
                if self.sparse:  # staging released: the prompt KV now lives in host DRAM
                    self._resize(r, self.hbm_need(r.ctx), self.host_need(r.ctx, r))
                    r.staging = 0.0
        for r in plan.decode:
            r.generated += 1
        done = [r for r in plan.decode if r.generated >= r.output]
        done += [r for r in finished_prefill if r.generated >= r.output]
        if done:
            for r in done:
                r.state = "done"
                r.finish_t = now
                self._free(r)
            self.running = [r for r in self.running if r.state != "done"]
            self.done.extend(done)
            if self.on_done is not None:
                for r in done:
                    self.on_done(r, now)
        self._grow(plan)
        return finished_prefill

    def _grow(self, plan: BatchPlan) -> None:
        """Take one more block for decode requests that crossed a block boundary; preempt when a pool is full."""
        bs = self.bs
        for r in plan.decode:
            ctx = r.prompt + r.generated  # == r.ctx while decoding
            if ctx % bs != 1 and bs != 1:
                continue
            if r.state != "decode":
                continue
            while not self._resize(r, self.hbm_need(ctx), self.host_need(ctx, r)):
                victim = max((x for x in self.running if x.state != "done"), key=lambda x: x.seq)
                self._preempt(victim)
                if victim is r:
                    break

    def _preempt(self, r: Req) -> None:
        self._free(r)
        self.preemptions += 1
        r.preempted += 1
        r.state = "waiting"
        r.prefill_target = r.prompt + max(0, r.generated - 1)
        r.prefill_done = 0
        self.running.remove(r)
        self.waiting.appendleft(r)
