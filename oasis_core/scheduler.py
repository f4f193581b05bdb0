"""The one scheduler both backends run: continuous batching, FCFS admission against a GPU and a host budget,
chunked prefill with decodes mixed into the same step, memory grown a block at a time, preemption by recomputation,
abort and rejection. Standard library only (no numpy, no torch).

The step is ``plan = scheduler.schedule(now)`` -> the backend executes the plan -> ``scheduler.update(plan, now,
stopped)``. A backend supplies the memory arithmetic through an :class:`Accounting` (the simulator in bytes of its
HBM and host pools, the executor in GPU lanes and host blocks); the scheduler never knows the units.

Rules (docs/scheduler.md has them with the reasons):

- **Admission** is FCFS: the head of the queue is admitted when it is ready (``ready_t <= now``), the batch has room
  (``max_batch``) and the accounting can give it what it needs to hold its prefill target (``staging=True``: the
  prompt KV a sparse backend holds on the GPU while prefilling). Nobody overtakes the head.
- **Rejection**: a request that can never be admitted ends at once as ``rejected`` with a reason, so it never blocks
  the queue: ``context_limit`` (prompt + max_tokens above ``max_context``), ``gpu_capacity`` / ``host_capacity``
  (its prefill or its full context needs more than the empty pool holds). Checked when it is added and again when
  it reaches the head (a preempted request re-prefills a longer target).
- **A step** decodes one token of every request in the decode state and prefills chunks of the prefilling requests
  in admission order, at most ``prefill_tokens`` prompt tokens in all (with ``decode_with_prefill=False`` a step
  that prefills decodes nothing: prompts first).
- **Growth**: after a step every request that decoded or finished its prefill holds what ``prompt + generated``
  tokens need (the newest token's KV is written by the next step), which takes a block at a time.
- **Preemption**: when a pool cannot grow, the most recently admitted request is preempted: its memory is freed,
  it returns to the front of the queue and later re-prefills its prompt plus every generated token but the last
  (its output so far is kept; the last token is the next decode's input).
- Every request added ends exactly once: ``completed`` (reason ``length`` or ``stop``), ``rejected`` (its reason)
  or ``aborted``.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Protocol

from .echo import show

WAITING, PREFILL, DECODE = "waiting", "prefill", "decode"
COMPLETED, REJECTED, ABORTED = "completed", "rejected", "aborted"
ENDED = (COMPLETED, REJECTED, ABORTED)
REJECT_REASONS = ("context_limit", "gpu_capacity", "host_capacity")


class Request:
    """The scheduling state of one request. Backends subclass it for what they keep besides (token ids, timing)."""

    __slots__ = (
        "id",
        "prompt_len",
        "max_tokens",
        "ready_t",
        "state",
        "prefill_done",
        "prefill_target",
        "generated",
        "preempted",
        "seq",
        "gpu_held",
        "host_held",
        "admit_t",
        "first_token_t",
        "finish_t",
        "reason",
    )

    def __init__(self, *, id, prompt_len: int, max_tokens: int, ready_t: float = 0.0, prefilled: int = 0):
        if not isinstance(prompt_len, int) or prompt_len < 1:
            raise ValueError(f"Request.prompt_len: must be an int >= 1, got {show(prompt_len)}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"Request.max_tokens: must be an int >= 1, got {show(max_tokens)}")
        if not 0 <= prefilled <= prompt_len:
            raise ValueError(f"Request.prefilled: must be in [0, {prompt_len}], got {show(prefilled)}")
        self.id = id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens  # output tokens at which it completes (unless a stop token comes first)
        self.ready_t = ready_t  # not admitted before this time
        self.state = WAITING
        self.prefill_done = prefilled  # tokens of prefill_target whose KV exists (a cached prefix, a synthesized KV)
        self.prefill_target = prompt_len  # the prompt, plus every generated token but the last after a preemption
        self.generated = 0  # output tokens so far
        self.preempted = 0
        self.seq = 0  # admission order: the preemption victim is the largest
        self.gpu_held = 0.0  # accounting units held (bytes, lanes, ...)
        self.host_held = 0.0
        self.admit_t = None  # first admission
        self.first_token_t = None
        self.finish_t = None
        self.reason = None  # completed: length | stop; rejected: one of REJECT_REASONS; aborted: abort

    @property
    def ctx(self) -> int:
        """Tokens whose KV exists or is being made (prefilled part + tokens generated beyond the prefill target)."""
        return self.prefill_done + max(0, self.generated - (self.prefill_target - self.prompt_len))

    @property
    def ended(self) -> bool:
        return self.state in ENDED


class Accounting(Protocol):
    """What a backend tells the scheduler about memory. Units are the backend's (bytes, lanes, blocks)."""

    def need(self, req: Request, tokens: int, *, staging: bool) -> tuple:
        """(gpu, host) units ``req`` holds with ``tokens`` tokens of KV; ``staging``: while it prefills them."""

    def capacity(self) -> tuple:
        """(gpu, host) units of the empty pools."""

    def resize(self, req: Request, gpu: float, host: float) -> bool:
        """Move ``req``'s holdings from (``req.gpu_held``, ``req.host_held``) to (gpu, host); False, with nothing
        changed, when a pool cannot give the growth. The scheduler updates ``gpu_held`` / ``host_held``."""


@dataclass(frozen=True)
class Chunk:
    """``n`` tokens of ``req``'s prefill target from position ``start``."""

    req: Request
    n: int
    start: int

    @property
    def last(self) -> bool:
        """The chunk that ends the prefill target (the backend computes the logits of its last position)."""
        return self.start + self.n >= self.req.prefill_target


@dataclass(frozen=True)
class Plan:
    """What one step does, and what changed since the previous plan. The only object a backend executes."""

    step: int
    admitted: tuple = ()  # Request, admitted by this schedule() call, in order
    preempted: tuple = ()  # Request, preempted by the previous update() (memory already freed)
    rejected: tuple = ()  # Request, rejected since the previous plan
    prefill: tuple = ()  # Chunk, in admission order
    decode: tuple = ()  # Request, one token each (a speculative backend: one or more), in admission order

    @property
    def empty(self) -> bool:
        """Nothing to compute (admissions or rejections alone are not a step)."""
        return not self.prefill and not self.decode

    def describe(self) -> tuple:
        """The plan as plain values (ids and sizes): what two backends scheduling the same trace must agree on."""
        return (
            tuple(r.id for r in self.admitted),
            tuple(r.id for r in self.preempted),
            tuple((r.id, r.reason) for r in self.rejected),
            tuple((c.req.id, c.start, c.n) for c in self.prefill),
            tuple(r.id for r in self.decode),
        )


class Scheduler:
    def __init__(
        self,
        *,
        accounting: Accounting,
        prefill_tokens: int,
        max_batch: int | None = None,
        max_context: int | None = None,
        decode_with_prefill: bool = True,
        on_admit: Callable | None = None,
        on_end: Callable | None = None,
    ):
        if not isinstance(prefill_tokens, int) or prefill_tokens < 1:
            raise ValueError(f"Scheduler.prefill_tokens: must be an int >= 1, got {show(prefill_tokens)}")
        if max_batch is not None and (not isinstance(max_batch, int) or max_batch < 1):
            raise ValueError(f"Scheduler.max_batch: must be an int >= 1 or None, got {show(max_batch)}")
        if max_context is not None and (not isinstance(max_context, int) or max_context < 1):
            raise ValueError(f"Scheduler.max_context: must be an int >= 1 or None, got {show(max_context)}")
        self.acct = accounting
        self.prefill_tokens = prefill_tokens
        self.max_batch = max_batch
        self.max_context = max_context
        self.decode_with_prefill = decode_with_prefill
        self.on_admit = on_admit  # callback(req, now) at every admission
        self.on_end = on_end  # callback(req, now) when a request ends (any way)
        self.waiting: deque = deque()
        self.running: dict = {}  # id -> Request, in admission order
        self.preemptions = 0
        self.rejections: Counter = Counter()  # reason -> requests
        self.step = 0
        self._seq = 0
        self._preempted: list = []
        self._rejected: list = []

    # -- requests in and out ---------------------------------------------------------------------------------------
    def add(self, req: Request, now: float = 0.0) -> bool:
        """Queue ``req``; False when it was rejected at once (``req.reason`` says why)."""
        if req.state != WAITING:
            raise ValueError(f"Scheduler.add: request {show(req.id)} is {req.state}, not waiting")
        reason = self._never_fits(req, final=True)
        if reason is not None:
            self._reject(req, reason, now)
            return False
        self.waiting.append(req)
        return True

    def abort(self, req_id, now: float = 0.0) -> Request | None:
        """End a waiting or running request now and free what it holds; None when the id is unknown or ended."""
        r = self.running.pop(req_id, None)
        if r is None:
            r = next((x for x in self.waiting if x.id == req_id), None)
            if r is None:
                return None
            self.waiting.remove(r)
        self._free(r)
        self._end(r, ABORTED, "abort", now)
        return r

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step ----------------------------------------------------------------------------------------------------
    def schedule(self, now: float = 0.0) -> Plan:
        acct, admitted = self.acct, []
        while self.waiting and (self.max_batch is None or len(self.running) < self.max_batch):
            r = self.waiting[0]
            if r.ready_t > now:
                break
            reason = self._never_fits(r, final=False)
            if reason is not None:
                self.waiting.popleft()
                self._reject(r, reason, now)
                continue
            gpu, host = acct.need(r, r.prefill_target, staging=True)
            if not self._resize(r, gpu, host):
                break
            self.waiting.popleft()
            r.state = PREFILL if r.prefill_done < r.prefill_target else DECODE
            if r.admit_t is None:
                r.admit_t = now
            self._seq += 1
            r.seq = self._seq
            self.running[r.id] = r
            admitted.append(r)
            if self.on_admit is not None:
                self.on_admit(r, now)
        decode, prefill, budget = [], [], self.prefill_tokens
        for r in self.running.values():
            if r.state == DECODE:
                decode.append(r)
            elif budget > 0:
                n = min(budget, r.prefill_target - r.prefill_done)
                prefill.append(Chunk(r, n, r.prefill_done))
                budget -= n
        if prefill and not self.decode_with_prefill:
            decode = []
        plan = Plan(
            self.step, tuple(admitted), tuple(self._preempted), tuple(self._rejected), tuple(prefill), tuple(decode)
        )
        self._preempted, self._rejected = [], []
        self.step += 1
        return plan

    def update(self, plan: Plan, now: float = 0.0, stopped=(), emitted=None) -> list:
        """Fold a finished step in: token counts, first tokens, completions (``stopped``: ids whose new token was a
        stop token), then growth and preemption. ``emitted``: id -> output tokens a decode produced this step (a
        speculative step's accepted drafts and the target's token; absent ids: one). Returns the requests completed
        by this step."""
        stopped = set(stopped)
        emitted = emitted or {}
        finished_prefill = []
        for c in plan.prefill:
            r = c.req
            if r.state != PREFILL:  # aborted meanwhile
                continue
            r.prefill_done += c.n
            if r.prefill_done >= r.prefill_target:
                if r.generated == 0:
                    r.generated = 1  # the prefill's last position yields the first output token
                    r.first_token_t = now
                r.state = DECODE
                finished_prefill.append(r)
        decoded = [r for r in plan.decode if r.state == DECODE]
        for r in decoded:
            n = emitted.get(r.id, 1) if emitted else 1
            if not isinstance(n, int) or n < 1 or r.generated + n > r.max_tokens:
                raise ValueError(
                    f"Scheduler.update: request {show(r.id)} emitted {show(n)} tokens; must be 1 .. "
                    f"{r.max_tokens - r.generated} (max_tokens {r.max_tokens}, {r.generated} generated)"
                )
            r.generated += n
            if r.first_token_t is None:  # a synthesized prefill: the first decode yields the first token
                r.first_token_t = now
        done = [r for r in decoded + finished_prefill if r.generated >= r.max_tokens or r.id in stopped]
        for r in done:
            del self.running[r.id]
            self._free(r)
            self._end(r, COMPLETED, "stop" if r.id in stopped else "length", now)
        self._grow_all(finished_prefill, decoded)
        return done

    # -- internals ---------------------------------------------------------------------------------------------------
    def _never_fits(self, r: Request, final: bool):
        if self.max_context is not None and r.prompt_len + r.max_tokens > self.max_context:
            return "context_limit"
        cap_gpu, cap_host = self.acct.capacity()
        needs = [self.acct.need(r, r.prefill_target, staging=True)]
        if final:
            needs.append(self.acct.need(r, r.prompt_len + r.max_tokens, staging=False))
        for gpu, host in needs:
            if gpu > cap_gpu:
                return "gpu_capacity"
            if host > cap_host:
                return "host_capacity"
        return None

    def _resize(self, r: Request, gpu: float, host: float) -> bool:
        if gpu == r.gpu_held and host == r.host_held:
            return True
        if not self.acct.resize(r, gpu, host):
            return False
        r.gpu_held, r.host_held = gpu, host
        return True

    def _free(self, r: Request) -> None:
        self._resize(r, 0.0, 0.0)

    def _grow_all(self, finished_prefill, decoded) -> None:
        """``_grow`` every request still decoding, those that finished their prefill this step first, then the
        decoded ones, in order (a backend may skip those whose need did not change)."""
        for r in finished_prefill + decoded:
            if r.state == DECODE:
                self._grow(r)

    def _grow(self, r: Request) -> None:
        """Hold what ``r.ctx`` tokens need; preempt the newest request until it fits (or ``r`` itself is out)."""
        gpu, host = self.acct.need(r, r.ctx, staging=False)
        while not self._resize(r, gpu, host):
            victim = next(reversed(self.running.values()))
            self._preempt(victim)
            if victim is r:
                return

    def _preempt(self, r: Request) -> None:
        del self.running[r.id]
        self._free(r)
        self.preemptions += 1
        r.preempted += 1
        r.state = WAITING
        r.prefill_target = r.prompt_len + max(0, r.generated - 1)
        r.prefill_done = 0
        self.waiting.appendleft(r)
        self._preempted.append(r)

    def _reject(self, r: Request, reason: str, now: float) -> None:
        self.rejections[reason] += 1
        self._rejected.append(r)
        self._end(r, REJECTED, reason, now)

    def _end(self, r: Request, state: str, reason: str, now: float) -> None:
        r.state, r.reason, r.finish_t = state, reason, now
        if self.on_end is not None:
            self.on_end(r, now)
