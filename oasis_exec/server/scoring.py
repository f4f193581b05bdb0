"""Scoring a prompt (`/v1/completions` with `echo` and `logprobs`) with the attention of the mode that is served.

Evaluation harnesses (lm-eval's `local-completions`, ...) send `echo: true, logprobs: N` and `max_tokens` 0 or 1,
and read each prompt token's log-probability given the tokens before it. Which attention computes those is the
server's `--score-attention` (`ServerConfig.score_attention`):

- `served` (the default): the served mode's. Where decode attends the whole context (`dense`; the engine's
  `model_info.sparse_decode` is false) that is the prefill's dense forward over the prompt (`prompt_logprobs`, or
  `score_next` when one output token is asked: one prefill, no decode step). In a sparse mode it is *teacher-forced
  decode*: the prompt's first `P` tokens (`--score-prefill-tokens`, default 1) are prefilled, as every served prompt
  is (densely), and each later prompt token is fed as the forced output of a decode step of the mode -- its
  selection, prefetch and draft head run as in generation -- whose logits score it (`Sampling.forced_ids`). So the
  scores are what the sparse decode computes, one decode step a scored token; the requested output tokens follow.
  Tokens 1..P-1 are scored by the dense forward over the first P tokens (the prefill's attention).
- `dense`: the dense reference in every mode (the prefill's forward over the whole prompt), for comparison.

A score of a sparse mode with `P` greater than 1 is the mode's decode of a text whose first `P` tokens were a prompt:
`P` = the length of a harness's context gives the served semantics of "prefill the context, decode the
continuation" exactly (a generation's log-probabilities equal the scores of its own text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Sequence

from .context import ServerContext
from .engine_loop import Event, RequestStream
from .engine_protocol import Sampling, TokenLogprobs
from .errors import APIError
from .generation import Outcome, Piece, StopMatcher, no_output, text_pieces


@dataclass
class Scored:
    """A completion's request as started: its engine stream (None when no request runs), its pieces, and the
    prompt's entries (None for the first token, then one `TokenLogprobs` a prompt token), which are filled when the
    pieces yield their first (before, on the dense paths)."""

    stream: RequestStream | None
    pieces: AsyncIterator[Piece]
    prompt: list = field(default_factory=list)


class _Rest:
    """A request stream after its forced tokens: what is left of the event that held the last one, then the queue."""

    def __init__(self, stream: RequestStream, first: Event | None) -> None:
        self._stream, self._first = stream, first
        self.queue = self

    async def get(self) -> Event:
        if self._first is not None:
            ev, self._first = self._first, None
            return ev
        return await self._stream.queue.get()


async def _forced(stream: RequestStream, n: int) -> tuple[list[TokenLogprobs], Event | None]:
    """The logprobs of the stream's first `n` tokens, and the rest of the event that completed them."""
    got: list[TokenLogprobs] = []
    while True:
        ev: Event = await stream.queue.get()
        need = n - len(got)
        if ev.finish_reason == "error" or ev.logprobs is None and ev.token_ids:
            raise APIError(
                503 if ev.error_code == "server_shutting_down" else 500,
                ev.error or "scoring the prompt: the engine returned no logprobs",
                code=ev.error_code,
            )
        got.extend((ev.logprobs or ())[:need])
        if len(got) == n:
            rest_ids, rest_lp = ev.token_ids[need:], (ev.logprobs or ())[need:]
            if rest_ids or ev.terminal:
                return got, Event(rest_ids, ev.finish_reason, ev.error, rest_lp if rest_ids else None, ev.error_code)
            return got, None
        if ev.terminal:
            raise APIError(
                500, f"scoring the prompt: the request ended ({ev.finish_reason}) early", code="engine_error"
            )


async def start(
    ctx: ServerContext, *, ids: list[int], sampling: Sampling | None, req, top_n: int, outcome: Outcome
) -> Scored:
    """Start an `echo` + `logprobs` completion of `ids` (`sampling`: None for `max_tokens` 0)."""
    engine, prefill_tokens = ctx.engine, ctx.config.score_prefill_tokens
    if ctx.config.score_attention == "served" and ctx.info.sparse_decode and len(ids) > prefill_tokens:
        return await _start_forced(ctx, ids, sampling, req, top_n, outcome)
    if sampling is None:
        return Scored(None, no_output(outcome), await ctx.score_prompt(ids, top_n))
    if sampling.max_tokens == 1 and callable(getattr(engine, "score_next", None)):
        try:
            prompt, tok, lp = await ctx.loop.call(lambda: engine.score_next(ids, top_n, sampling))
        except APIError:
            raise
        except Exception as exc:
            raise APIError(
                500, f"scoring the prompt failed: {type(exc).__name__}: {exc}", code="engine_error"
            ) from None
        return Scored(None, _one(tok, lp, sampling, req.stop, ctx.tokenizer, outcome), prompt)
    prompt = await ctx.score_prompt(ids, top_n)
    stream = await ctx.submit(ids, sampling, bool(req.stop))
    return Scored(stream, text_pieces(stream, ctx.tokenizer.detokenizer(), req.stop, ctx.loop.abort, outcome), prompt)


async def _start_forced(
    ctx: ServerContext, ids: list[int], sampling: Sampling | None, req, top_n: int, outcome: Outcome
) -> Scored:
    prefill_tokens, tokenizer, abort = ctx.config.score_prefill_tokens, ctx.tokenizer, ctx.loop.abort
    head, forced = ids[:prefill_tokens], tuple(ids[prefill_tokens:])
    more = sampling.max_tokens if sampling is not None else 0
    stream = await ctx.submit(
        head,
        Sampling(
            max_tokens=len(forced) + more,
            temperature=req.temperature,
            top_p=req.top_p,
            stop_token_ids=tuple(tokenizer.eos_token_ids),
            seed=req.seed,
            logprobs=top_n,
            forced_ids=forced,
        ),
        bool(req.stop) and more > 0,  # (no more: no reader matches stop strings, pieces() below)
    )
    scored = Scored(stream, None, [])  # pieces below

    async def pieces() -> AsyncIterator[Piece]:
        scored.prompt = (await ctx.score_prompt(head, top_n)) if len(head) > 1 else [None]
        got, rest = await _forced(stream, len(forced))
        scored.prompt = scored.prompt + got
        if not more:
            outcome.finish_reason = "length"
            yield Piece("", "length")
            return
        rest_stream = _Rest(stream, rest)
        async for p in text_pieces(
            rest_stream, tokenizer.detokenizer(), req.stop, lambda _s, r: abort(stream, r), outcome
        ):
            yield p

    scored.pieces = pieces()
    return scored


async def _one(tok: int, lp: TokenLogprobs, sampling: Sampling, stops: Sequence[str], tokenizer, outcome: Outcome):
    """The one output token of `score_next`, as `text_pieces` would report it."""
    detok, matcher = tokenizer.detokenizer(), StopMatcher(list(stops))
    text, hit = matcher.feed(detok.push([tok]) + detok.flush())
    if not hit:
        text += matcher.flush()
    outcome.completion_tokens = 1
    outcome.finish_reason = "stop" if hit or tok in sampling.stop_token_ids else "length"
    yield Piece(text, outcome.finish_reason, (tok,), (lp,) if sampling.logprobs is not None else None)
