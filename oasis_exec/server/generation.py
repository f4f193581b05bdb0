"""From engine events to text: incremental detokenization and stop strings.

`text_pieces` turns a request's event stream into `Piece`s: a text delta, the finish reason of the last one, and the
tokens (with their logprobs, when asked) that arrived with it. Text that could be the start of a stop string is
held back until it is known not to be one, so a stop string never reaches the client; when one appears the request
is aborted in the engine and ends with finish reason "stop". Tokens are reported as they arrive (the tokens that
produced a stop string included), so a piece's tokens and its text need not line up exactly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from .engine_loop import Event, RequestStream
from .engine_protocol import TokenLogprobs
from .tokenizer import Detokenizer


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buf = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was found)."""
        self.buf += text
        hits = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.buf = self.buf[: min(hits)], ""
            return out, True
        cut = max(len(self.buf) - self.hold, 0)
        out, self.buf = self.buf[:cut], self.buf[cut:]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


@dataclass
class Outcome:
    """Filled in as a request runs; read after the pieces are exhausted."""

    completion_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    error_code: str = "engine_error"


@dataclass(frozen=True)
class Piece:
    text: str
    finish_reason: str | None = None  # on the last piece: "length" | "stop" | "abort" | "error"
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprobs, ...] | None = None


async def text_pieces(
    stream: RequestStream,
    detok: Detokenizer,
    stops: list[str],
    abort: Callable[[RequestStream, str], None],
    outcome: Outcome,
) -> AsyncIterator[Piece]:
    """Yield pieces while running; the last one has the finish reason (errors end in "error"). When done (or
    closed early) it tells ``abort`` its outcome, which settles an end the engine left to it (a stop string completed
    by the last tokens of a request that ended by length: ``EngineLoop.abort``)."""
    try:
        async for piece in _pieces(stream, detok, stops, abort, outcome):
            yield piece
    finally:
        abort(stream, outcome.finish_reason or "abort")


async def _pieces(stream, detok, stops, abort, outcome) -> AsyncIterator[Piece]:
    matcher = StopMatcher(stops)
    while True:
        ev: Event = await stream.queue.get()
        text, hit, n = "", False, len(ev.token_ids)
        if stops and n > 1:  # a decode chain: stop at the token that completes a stop string
            for i, tid in enumerate(ev.token_ids):
                out, hit = matcher.feed(detok.push((tid,)))
                text += out
                if hit:
                    n = i + 1  # usage counts what is returned: no token decoded past the stop string
                    break
        else:
            text, hit = matcher.feed(detok.push(ev.token_ids))
        outcome.completion_tokens += n
        tokens = {"token_ids": ev.token_ids[:n], "logprobs": ev.logprobs[:n] if ev.logprobs is not None else None}
        if hit:
            abort(stream, "stop")
            outcome.finish_reason = "stop"
            yield Piece(text, "stop", **tokens)
            return
        if ev.terminal:
            if ev.finish_reason == "error":
                outcome.finish_reason, outcome.error, outcome.error_code = "error", ev.error, ev.error_code
                yield Piece(text, "error", **tokens)
                return
            tail, hit = matcher.feed(detok.flush())
            tail = tail if hit else tail + matcher.flush()
            outcome.finish_reason = "stop" if hit else ev.finish_reason
            yield Piece(text + tail, outcome.finish_reason, **tokens)
            return
        if text or ev.logprobs is not None:  # logprobs are sent as their tokens arrive
            yield Piece(text, **tokens)


async def no_output(outcome: Outcome) -> AsyncIterator[Piece]:
    """The pieces of a request that generates nothing (`max_tokens` 0): one empty piece, ended by "length"."""
    outcome.finish_reason = "length"
    yield Piece("", "length")


async def merged_events(gens: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """(index of its generator, item) as each generator yields, all running concurrently; one generator is
    iterated directly."""
    if len(gens) == 1:
        async for item in gens[0]:
            yield 0, item
        return
    q: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, gen: AsyncIterator) -> None:
        try:
            async for item in gen:
                await q.put((i, item))
        finally:
            await q.put((i, done))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(tasks)
        while left:
            i, item = await q.get()
            if item is done:
                left -= 1
                if tasks[i].done() and tasks[i].exception() is not None:
                    raise tasks[i].exception()
                continue
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
