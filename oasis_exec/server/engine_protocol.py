"""The contract between the HTTP server and an inference engine.

The server never touches the engine from more than one thread: every call below is made from the engine thread
that `engine_loop.EngineLoop` owns, so an engine needs no locking of its own. The real executor engine is wrapped
to this protocol by `adapter.py`; tests may implement it with a fake.

Lifecycle of a request, as the server sees it:

1. `add_request(prompt_ids, sampling)` returns an id (any hashable); it raises `ValueError` when the request can
   never be served (too long for the context, or for the host pool), which the server turns into a 400.
2. Each `step()` runs one schedule -> execute -> update iteration and returns, for every request that made
   progress, the token ids it produced in that step and, when it ended in that step, why (`"length"` or
   `"stop"`). A request that is merely waiting produces no output.
3. `abort(id)` ends a request at once and frees whatever it holds (GPU slots, host blocks); aborting an unknown
   or finished id is a no-op.
4. With `sampling.logprobs` set to N (>= 0), every `StepOutput` of that request carries, for each new token, its
   log-probability under the model's distribution (the raw logits, before temperature and top_p) and the N most
   likely tokens with theirs (`TokenLogprobs`); otherwise `logprobs` is None.
5. Optional: `prompt_logprobs(prompt_ids, n)` scores a prompt without generating: for each prompt token after the
   first, its log-probability given the tokens before it and the N most likely alternatives (the first entry is
   None). It runs on the engine thread between steps. An engine without it cannot serve `echo` with `logprobs`.
   Optional: `score_next(prompt_ids, n, sampling)` returns those entries and also the first output token (id and
   `TokenLogprobs`) sampled from the last prompt position as the engine's prefill would, in the same forward: what
   `echo` with `max_tokens` 1 needs (one prefill, no decode step).
6. Teacher forcing: `sampling.forced_ids` makes the request's first outputs these tokens, each decoded by the
   engine's own decode step (a stop id among them does not end the request); their `logprobs` are the model's at
   each step. `model_info.sparse_decode` says that decode attends a selection of the context (a sparse mode), so
   that a prompt scored by `prompt_logprobs` (a dense forward) would not be what the served mode computes; the
   server then scores prompts by forced decode (`scoring.py`). An engine with `sparse_decode` must force tokens.
7. Optional: `check()` raises when the engine cannot serve (for example, its device is lost); the server calls it
   while idle after a failed step, to tell when `/health` may report healthy again. Without it, the next
   successful step is the only evidence.
8. `stats()` is a snapshot for `/metrics` and for admission (its `waiting` count gates 429s), called after
   every step: it must be cheap, so an engine caches whatever costs a device synchronisation. When no request is
   in flight, the usage fields must read zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Protocol, Sequence, runtime_checkable

FINISH_REASONS = ("length", "stop")


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters the server passes to the engine (temperature 0 = greedy)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    logprobs: int | None = None  # None: not asked; N: each token's logprob and the N most likely alternatives
    forced_ids: tuple[int, ...] = ()  # teacher forcing: the first outputs are these tokens (see the module docstring)

    def __post_init__(self) -> None:
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs: must be >= 0, got {self.logprobs}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if len(self.forced_ids) > self.max_tokens:
            raise ValueError(f"forced_ids: {len(self.forced_ids)} tokens exceed max_tokens {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class TokenLogprobs:
    """A token's log-probability and the most likely tokens at its position, as (token id, logprob), best first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class StepOutput:
    """What one request produced in one engine step."""

    request_id: Hashable
    new_token_ids: tuple[int, ...]
    finish_reason: str | None = None  # None while running, else one of FINISH_REASONS
    logprobs: tuple[TokenLogprobs, ...] | None = None  # one a new token, when the request asked for them


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's state. Byte and stall counters are cumulative since start."""

    running: int = 0
    waiting: int = 0
    gpu_slots_used: int = 0
    gpu_slots_total: int = 0
    host_blocks_used: int = 0
    host_blocks_total: int = 0
    prefetch_bytes: int = 0
    hidden_fraction: float = float("nan")  # share of transfer time hidden behind compute; NaN = not measured
    stall_s: float = 0.0  # time layers spent waiting for their transfers
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    """What the server must know about the served model."""

    name: str
    max_model_len: int  # prompt + generated tokens, at most
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    model_dir: str | None = None  # a local Hugging Face directory, when the weights come from one
    dummy: bool = False
    mode: str = "lookahead"
    device: str = "cpu"
    sparse_decode: bool = False  # decode attends a selection of the context: prompts are scored by forced decode


@runtime_checkable
class ServingEngine(Protocol):
    """The engine API the server drives; see the module docstring for the contract."""

    @property
    def model_info(self) -> ModelInfo: ...

    def add_request(self, prompt_ids: Sequence[int], sampling: Sampling) -> Hashable: ...

    def step(self) -> list[StepOutput]: ...

    def abort(self, request_id: Hashable) -> None: ...

    def has_unfinished(self) -> bool: ...

    def stats(self) -> EngineStats: ...
