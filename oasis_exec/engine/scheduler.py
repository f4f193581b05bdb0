"""The executor's side of the one scheduler (``oasis_core.scheduler``). Pure Python: never imports torch.

- ``EngineRequest``: the core's scheduling state plus the token ids, the sampling parameters, the lane and the host
  block ids (in logical block order).
- ``LaneAccounting``: the core's ``Accounting`` in lanes (the GPU budget: a lane is one request's fixed share of
  the GPU KV state, sized by the runner from ``--kv-budget-gb``) and host blocks (``--host-kv-gb``; dense and quest
  keep no host copy and need none). A request takes its lane at admission and its host blocks as it grows; with a
  short-context rule (``oasis_core.short_context``) a sparse-mode request holds ``host_tokens(ctx)`` tokens' blocks:
  none while its context fits the resident set, all of them from its crossing step on.
- ``Admit``, ``PrefillChunk``, ``DecodeItem``, ``RunnerCall``: what one runner call executes. The engine cuts a
  core ``Plan`` into runner calls (its prefill chunks, then its decode batch); they carry no decision of their own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from oasis_core.scheduler import Request as CoreRequest


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    stop_ids: tuple = ()
    seed: int | None = None  # None: a key derived from the engine seed and the request id
    top_p: float = 1.0  # nucleus sampling: draw from the smallest top set holding this much probability
    # teacher forcing: output token i is forced[i] (the logits it was sampled from are still the model's), and a
    # stop id among them does not stop the request; after them the request samples freely (``Engine._sample``)
    forced: tuple = ()

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens: must be an int >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature: must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p: must be in (0, 1], got {self.top_p!r}")
        if len(self.forced) > self.max_tokens:
            raise ValueError(f"SamplingParams.forced: {len(self.forced)} tokens exceed max_tokens {self.max_tokens}")


class EngineRequest(CoreRequest):
    __slots__ = ("prompt", "output", "sampling", "synthetic_prefill", "lane", "host_blocks")

    def __init__(self, *, id, prompt: list, sampling: SamplingParams, synthetic_prefill: bool = False):
        if len(prompt) < 1:
            raise ValueError("prompt: must hold at least one token")
        # A synthesized prefill (benchmarks) has the prompt's KV at admission; its first decode yields token one.
        super().__init__(
            id=id,
            prompt_len=len(prompt),
            max_tokens=sampling.max_tokens,
            prefilled=len(prompt) if synthetic_prefill else 0,
        )
        self.prompt = list(prompt)
        self.output: list = []
        self.sampling = sampling
        self.synthetic_prefill = synthetic_prefill
        self.lane = -1
        self.host_blocks: list = []

    @property
    def n_tokens(self) -> int:
        """Tokens whose KV is (or is being) stored: the prompt and every output token but the last."""
        return len(self.prompt) + max(len(self.output) - 1, 0)

    @property
    def finish_reason(self) -> str | None:
        return self.reason

    def token_at(self, position: int) -> int:
        """The token id at ``position`` of prompt + output."""
        n = len(self.prompt)
        return self.prompt[position] if position < n else self.output[position - n]


class LaneAccounting:
    """``oasis_core.scheduler.Accounting`` in GPU lanes and host block ids."""

    def __init__(self, *, max_lanes: int, host_blocks: int, block_size: int, needs_host: bool, short=None):
        if max_lanes < 1:
            raise ValueError(f"max_lanes: must be >= 1, got {max_lanes} (the KV budget fits no request)")
        self.max_lanes, self.host_total, self.bs, self.needs_host = max_lanes, host_blocks, block_size, needs_host
        self.short = short  # oasis_core.short_context.ShortContext (sparse modes with the rule on), else None
        self.free_lanes = list(range(max_lanes))
        self.free_host = deque(range(host_blocks))
        self.grown: list = []  # (request, new host block ids) of running requests, drained by the engine

    def need(self, r: EngineRequest, tokens: int, *, staging: bool) -> tuple:
        if not self.needs_host:
            return 1, 0
        if self.short is not None:
            tokens = self.short.host_tokens(tokens)
        return 1, -(-tokens // self.bs)

    def capacity(self) -> tuple:
        return self.max_lanes, self.host_total

    def resize(self, r: EngineRequest, gpu, host) -> bool:
        lanes, blocks = int(gpu), int(host)
        had_lane = r.lane >= 0
        if (
            lanes > 1
            or (lanes > r.gpu_held and not self.free_lanes)
            or blocks - len(r.host_blocks) > len(self.free_host)
        ):
            return False
        if lanes and r.lane < 0:
            r.lane = self.free_lanes.pop(0)
        elif not lanes and r.lane >= 0:
            self.free_lanes.append(r.lane)
            self.free_lanes.sort()
            r.lane = -1
        if blocks > len(r.host_blocks):
            new = [self.free_host.popleft() for _ in range(blocks - len(r.host_blocks))]
            if r.host_blocks or had_lane:  # grown, or a short request's crossing (its first host blocks)
                self.grown.append((r, new))
            r.host_blocks.extend(new)
        elif blocks < len(r.host_blocks):
            self.free_host.extend(r.host_blocks[blocks:])
            del r.host_blocks[blocks:]
        return True

    def take_grown(self) -> list:
        out, self.grown = self.grown, []
        return out


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
    last: bool  # the chunk that ends the prefill target: the runner samples at its last position


@dataclass(frozen=True)
class DecodeItem:
    req_id: int
    lane: int
    token: int
    position: int  # position of ``token``; its KV is written there
    max_new: int = 1  # the most output tokens the step may emit for it (a speculative step: max_tokens - generated)


@dataclass(frozen=True)
class RunnerCall:
    """One call of ``Runner.execute``: admissions first, then one prefill chunk or one decode batch."""

    admit: tuple = ()
    prefill: PrefillChunk | None = None
    decode: tuple = ()  # DecodeItem, ordered by lane
    sampling: dict = field(default_factory=dict)  # req_id -> SamplingParams
    chain: int = 1  # the most decode steps the runner may chain in this call (ExecConfig.decode_chain)
    # how the call's rows are sampled: sampler(logits [rows, V], params a row) -> ids [rows], and optionally
    # sampler.draws(req_ids, n) -> a speculative step's uniforms; None: the runner's own (Runner.sampler)
    sampler: object = None
