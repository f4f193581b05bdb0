"""Continuous batching, admission and chunked prefill. Pure Python: never imports torch.

The scheduler owns requests, lanes (the executor's batch rows) and host block ids. ``schedule()`` returns one
``StepPlan``-like ``BatchPlan`` (the only object the executor reads), ``update(plan, result)`` folds the sampled
tokens back and retires finished requests. A retired (finished or aborted) request is handed to the caller once and
then forgotten, so nothing accumulates in a long-running server. A step is either one prefill chunk of one request
or one decode token for every running request (nano-vllm's split), so the executor runs one kind of batch at a time.

Admission needs a free lane (GPU budget: the executor sizes lanes from ``--kv-budget-gb``) and enough free host
blocks for the whole request (prompt + max_tokens, host budget from ``--host-kv-gb``; dense and quest modes keep
no host copy and pass ``host_blocks=0``... they admit on lanes alone).
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    stop_ids: tuple = ()
    seed: int | None = None  # None: a key derived from the engine seed and the request id
    top_p: float = 1.0  # nucleus sampling: draw from the smallest top set holding this much probability

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens: must be an int >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature: must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p: must be in (0, 1], got {self.top_p!r}")


@dataclass
class Request:
    id: int
    prompt: list
    sampling: SamplingParams
    synthetic_prefill: bool = False  # benchmarks: KV synthesized, not computed
    output: list = field(default_factory=list)
    lane: int = -1
    host_blocks: list = field(default_factory=list)
    n_prefilled: int = 0
    state: str = "waiting"  # waiting | prefill | running | finished | aborted
    finish_reason: str | None = None

    @property
    def n_tokens(self) -> int:
        """Tokens whose KV is (or is being) stored: the prompt and every output token but the last."""
        return len(self.prompt) + max(len(self.output) - 1, 0)


@dataclass(frozen=True)
class Admit:
    req_id: int
    lane: int
    host_blocks: tuple
    synthetic_prefill: bool
    prompt_len: int
    seed: int


@dataclass(frozen=True)
class PrefillChunk:
    req_id: int
    lane: int
    start: int
    tokens: tuple
    last: bool  # the chunk that ends the prompt: the executor samples the first output token


@dataclass(frozen=True)
class DecodeItem:
    req_id: int
    lane: int
    token: int
    position: int  # position of ``token``; its KV is written there


@dataclass(frozen=True)
class BatchPlan:
    """The scheduler -> executor contract for one step."""

    step: int
    admit: tuple = ()  # Admit, before anything else in the step
    release: tuple = ()  # lanes freed since the last step
    prefill: PrefillChunk | None = None
    decode: tuple = ()  # DecodeItem, ordered by lane
    sampling: dict = field(default_factory=dict)  # req_id -> SamplingParams

    @property
    def is_empty(self) -> bool:
        return self.prefill is None and not self.decode and not self.admit and not self.release


class Scheduler:
    def __init__(self, max_lanes: int, host_blocks: int, block_size: int, prefill_chunk: int = 2048,
                 needs_host: bool = True, interleave: bool = True):
        if max_lanes < 1:
            raise ValueError(f"max_lanes: must be >= 1, got {max_lanes} (the KV budget fits no request)")
        self.block_size, self.prefill_chunk, self.needs_host = block_size, prefill_chunk, needs_host
        # interleave: a prefill chunk is never followed by another while requests are decoding, so a decoding
        # request waits at most one chunk between its tokens (prompts-first starved decodes on the H200 server:
        # TPOT p50 131 ms against a ~20 ms step, experiments/serving_load/results/serve_h200.md).
        self.interleave = interleave
        self._last_prefill = False
        self.free_lanes = list(range(max_lanes))
        self.free_host = deque(range(host_blocks))
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # admitted (prefilling or decoding); retired requests are dropped
        self._released: list[int] = []
        self._ids = itertools.count()
        self.step = 0

    def add(self, prompt, sampling: SamplingParams, synthetic_prefill=False, req_id=None) -> int:
        if len(prompt) < 1:
            raise ValueError("prompt: must hold at least one token")
        rid = next(self._ids) if req_id is None else req_id
        self.waiting.append(Request(rid, list(prompt), sampling, synthetic_prefill))
        return rid

    def abort(self, req_id) -> Request | None:
        """End a waiting or running request now and free its lane and host blocks. Returns the request (state
        "aborted", finish_reason "abort"), or None when the id is unknown or already retired."""
        for r in self.waiting:
            if r.id == req_id:
                self.waiting.remove(r)
                r.state, r.finish_reason = "aborted", "abort"
                return r
        r = self.running.get(req_id)
        if r is None:
            return None
        self._retire(r, "abort")
        r.state = "aborted"
        return r

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _blocks_needed(self, r: Request) -> int:
        return -(-(len(r.prompt) + r.sampling.max_tokens) // self.block_size) if self.needs_host else 0

    def schedule(self) -> BatchPlan:
        admits = []
        while self.waiting and self.free_lanes and len(self.free_host) >= self._blocks_needed(self.waiting[0]):
            r = self.waiting.popleft()
            r.lane = self.free_lanes.pop(0)
            r.host_blocks = [self.free_host.popleft() for _ in range(self._blocks_needed(r))]
            r.state = "prefill"
            if r.synthetic_prefill:
                r.n_prefilled = len(r.prompt)
            self.running[r.id] = r
            admits.append(Admit(r.id, r.lane, tuple(r.host_blocks), r.synthetic_prefill, len(r.prompt),
                                r.sampling.seed if r.sampling.seed is not None else r.id))
        release, self._released = tuple(self._released), []
        sampling = {r.id: r.sampling for r in self.running.values()}
        # Prefill first (one chunk of the oldest prefilling request: ``running`` is in admission order, so one
        # prompt is finished before the next starts and one prompt's scratch KV is alive at a time), else decode;
        # with ``interleave``, a decode step comes between two chunks whenever some request is decoding.
        decoding = any(r.state == "running" for r in self.running.values())
        prefill_turn = not (self.interleave and self._last_prefill and decoding)
        self._last_prefill = False
        for r in self.running.values():
            if prefill_turn and r.state == "prefill" and not r.synthetic_prefill:
                self._last_prefill = True
                n = min(self.prefill_chunk, len(r.prompt) - r.n_prefilled)
                chunk = PrefillChunk(r.id, r.lane, r.n_prefilled, tuple(r.prompt[r.n_prefilled: r.n_prefilled + n]),
                                     r.n_prefilled + n == len(r.prompt))
                return BatchPlan(self.step, tuple(admits), release, chunk, (), sampling)
        items = []
        for r in sorted(self.running.values(), key=lambda x: x.lane):
            if r.state == "prefill" and r.synthetic_prefill:
                r.state = "running"  # first token: the last prompt token decoded at its position
                items.append(DecodeItem(r.id, r.lane, r.prompt[-1], len(r.prompt) - 1))
            elif r.state == "running":
                items.append(DecodeItem(r.id, r.lane, r.output[-1], len(r.prompt) + len(r.output) - 1))
        return BatchPlan(self.step, tuple(admits), release, None, tuple(items), sampling)

    def update(self, plan: BatchPlan, tokens: dict) -> list:
        """tokens: req_id -> sampled token id. Returns the requests finished in this step; the scheduler keeps no
        reference to them."""
        self.step += 1
        done = []
        if plan.prefill is not None:
            r = self.running.get(plan.prefill.req_id)
            if r is not None:
                r.n_prefilled += len(plan.prefill.tokens)
                if plan.prefill.last:
                    r.state = "running"
                    self._append(r, tokens[r.id], done)
        for it in plan.decode:
            r = self.running.get(it.req_id)
            if r is not None and it.req_id in tokens:
                if r.synthetic_prefill and not r.output and it.position == len(r.prompt) - 1:
                    pass  # the synthesized prompt's last token: its sample is the first output token
                self._append(r, tokens[it.req_id], done)
        return done

    def _append(self, r: Request, tok: int, done: list) -> None:
        r.output.append(int(tok))
        if int(tok) in r.sampling.stop_ids:
            self._retire(r, "stop")
            done.append(r)
        elif len(r.output) >= r.sampling.max_tokens:
            self._retire(r, "length")
            done.append(r)

    def _retire(self, r: Request, reason: str) -> None:
        self.running.pop(r.id, None)
        r.state, r.finish_reason = "finished", reason
        self.free_lanes.append(r.lane)
        self.free_lanes.sort()
        self._released.append(r.lane)
        self.free_host.extend(r.host_blocks)
        r.host_blocks = []
