"""`POST /v1/completions`: one or more prompts, each run as a request of its own (a choice), answered whole or
streamed with the choices' chunks interleaved as they come.

With `echo` a choice's text starts with its prompt; with `echo` and `logprobs` the prompt is scored too
(`scoring.py`), which is how evaluation harnesses read a text's log-likelihood. When one prompt fails, the others'
requests end too.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from fastapi import APIRouter, Request

from . import schemas as S
from . import scoring
from .context import ServerContext, context_of, ended_in_error, parse
from .engine_protocol import Sampling
from .generation import Outcome, Piece, merged_events
from .logprobs import CompletionLogprobs, merged_entries
from .prompts import prepare
from .streaming import sse, usage_chunk

router = APIRouter()

Prepared = list[tuple[list[int], Sampling | None]]  # each prompt's token ids and sampling


@router.post("/v1/completions")
async def completions(request: Request):
    ctx = context_of(request)
    body = await ctx.read_body(request)

    def decode() -> tuple[S.CompletionRequest, Prepared]:  # a worker thread
        req = parse(body, S.CompletionRequest)
        ctx.check_model(req.model)
        return req, [prepare(ctx.info, ctx.tokenizer, p, req) for p in req.prompts()]

    req, prepared = await ctx.loop.prepare(decode)
    reply = _CompletionReply(req, prompt_tokens=sum(len(ids) for ids, _ in prepared))
    runs = await _start_all(ctx, req, prepared)
    if req.stream:
        return sse(ctx, [run.scored.stream for run in runs], reply.events(runs))
    return await reply.whole(ctx, request, runs)


async def _start_all(ctx: ServerContext, req: S.CompletionRequest, prepared: Prepared) -> list[CompletionRun]:
    """A run for each prompt; when one cannot start, those started before it end."""
    runs: list[CompletionRun] = []
    try:
        for prompt, (ids, sampling) in zip(req.prompts(), prepared):
            runs.append(await CompletionRun.start(ctx, req, prompt, ids, sampling))
    except BaseException:
        ctx.abort_all(run.scored.stream for run in runs)
        raise
    return runs


class _CompletionReply:
    """The answer to one completions request, whole or in chunks."""

    def __init__(self, req: S.CompletionRequest, prompt_tokens: int) -> None:
        self.req, self.prompt_tokens = req, prompt_tokens
        self.id, self.created = S.new_id("cmpl"), S.now()

    async def whole(self, ctx: ServerContext, request: Request, runs: list[CompletionRun]) -> dict:
        try:
            choices = await asyncio.gather(*(run.choice(request, i) for i, run in enumerate(runs)))
        except BaseException:  # one prompt failed: the others' requests end too
            ctx.abort_all(run.scored.stream for run in runs)
            raise
        return S.CompletionResponse(
            id=self.id, created=self.created, model=self.req.model, choices=list(choices), usage=self._usage(runs)
        ).model_dump()

    async def events(self, runs: list[CompletionRun]) -> AsyncIterator[dict]:
        async for index, ev in merged_events([run.events() for run in runs]):
            if "error" in ev:
                yield ev
                return
            yield self._chunk(index, *ev["chunk"])
        if self.req.stream_options and self.req.stream_options.include_usage:
            yield usage_chunk(self._chunk(0, "", None), self._usage(runs))

    def _chunk(self, index: int, text: str, finish: str | None, logprobs: dict | None = None) -> dict:
        choice = S.CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=logprobs)
        return S.CompletionResponse(
            id=self.id, created=self.created, model=self.req.model, choices=[choice]
        ).model_dump(exclude_none=False)

    def _usage(self, runs: list[CompletionRun]) -> S.Usage:
        return S.Usage.of(self.prompt_tokens, sum(run.outcome.completion_tokens for run in runs))


class CompletionRun:
    """One prompt of a completions request, started: `choice()` runs it to its end, `events()` streams it."""

    def __init__(self, ctx: ServerContext, scored: scoring.Scored, outcome: Outcome, echo: str, ids: list[int], top_n):
        self.ctx, self.scored, self.outcome, self.echo, self.ids = ctx, scored, outcome, echo, ids
        self.lp = CompletionLogprobs(ctx.tokenizer) if top_n is not None else None
        if self.lp is not None:
            self.lp.skip_text(echo)  # the completion's offsets start after the echoed prompt

    @classmethod
    async def start(
        cls, ctx: ServerContext, req: S.CompletionRequest, prompt, ids: list[int], sampling: Sampling | None
    ) -> CompletionRun:
        outcome, top_n = Outcome(), req.top_n()
        echo = (prompt if isinstance(prompt, str) else ctx.tokenizer.decode(ids)) if req.echo else ""
        if req.echo and top_n is not None:
            scored = await scoring.start(ctx, ids=ids, sampling=sampling, req=req, top_n=top_n, outcome=outcome)
        else:
            stream, pieces = await ctx.start(ids, sampling, req.stop, outcome)
            scored = scoring.Scored(stream, pieces, None)
        return cls(ctx, scored, outcome, echo, ids, top_n)

    async def choice(self, request: Request, index: int) -> S.CompletionChoice:
        got = await self.ctx.collect(request, self.scored.stream, self.scored.pieces)
        if self.outcome.finish_reason == "error":
            raise ended_in_error(self.outcome)
        logprobs = None
        if self.lp is not None:
            parts = [self.lp.entries(p.token_ids, p.logprobs) for p in got if p.logprobs is not None]
            head = self._prompt_entries()
            logprobs = merged_entries(([head] if head else []) + parts)
        text = self.echo + "".join(p.text for p in got)
        return S.CompletionChoice(index=index, text=text, finish_reason=self.outcome.finish_reason, logprobs=logprobs)

    async def events(self) -> AsyncIterator[dict]:
        """`{"chunk": (text, finish, logprobs)}` a piece; `{"error": ...}` once on failure, and nothing after."""
        pieces = self.scored.pieces
        piece = await anext(pieces, None)  # the prompt's scores are ready once the first piece is
        if self.echo:
            yield {"chunk": (self.echo, None, self._prompt_entries())}
        while piece is not None:
            ev = self._event(piece)
            yield ev
            if "error" in ev:
                return
            piece = await anext(pieces, None)

    def _event(self, p: Piece) -> dict:
        if p.finish_reason == "error":
            return ended_in_error(self.outcome).body()
        lp = self.lp.entries(p.token_ids, p.logprobs) if self.lp is not None and p.logprobs is not None else None
        return {"chunk": (p.text, p.finish_reason, lp)}

    def _prompt_entries(self) -> dict | None:
        if self.lp is None or self.scored.prompt is None:
            return None
        return CompletionLogprobs(self.ctx.tokenizer).entries(self.ids, self.scored.prompt)
