"""`POST /v1/chat/completions`: one conversation, rendered by the model's chat template, answered whole or streamed.

A stream opens with the assistant's role (an empty content delta), sends one content delta a piece, and ends with
the finish reason; with `stream_options.include_usage` a last chunk carries the usage and no choices.
"""

from __future__ import annotations

from typing import AsyncIterator

from fastapi import APIRouter, Request

from . import schemas as S
from .context import context_of, ended_in_error, parse
from .engine_protocol import Sampling
from .generation import Outcome, Piece
from .logprobs import chat_entries
from .prompts import chat_prompt, prepare
from .streaming import sse, usage_chunk
from .tokenizer import Tokenizer

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    ctx = context_of(request)
    body = await ctx.read_body(request)

    def decode() -> tuple[S.ChatCompletionRequest, list[int], Sampling | None]:  # a worker thread
        req = parse(body, S.ChatCompletionRequest)
        ctx.check_model(req.model)
        return req, *prepare(ctx.info, ctx.tokenizer, chat_prompt(ctx.tokenizer, req.messages), req, chat=True)

    req, ids, sampling = await ctx.loop.prepare(decode)
    outcome = Outcome()
    stream, pieces = await ctx.start(ids, sampling, req.stop, outcome)
    reply = _ChatReply(ctx.tokenizer, req, len(ids), outcome)
    if req.stream:
        return sse(ctx, [stream], reply.events(pieces))
    got = await ctx.collect(request, stream, pieces)
    if outcome.finish_reason == "error":
        raise ended_in_error(outcome)
    return reply.whole(got)


class _ChatReply:
    """The answer to one chat request, whole or in chunks; `outcome` is complete once the pieces are."""

    def __init__(self, tokenizer: Tokenizer, req: S.ChatCompletionRequest, prompt_tokens: int, outcome: Outcome):
        self.tokenizer, self.req, self.prompt_tokens, self.outcome = tokenizer, req, prompt_tokens, outcome
        self.id, self.created = S.new_id("chatcmpl"), S.now()

    def whole(self, got: list[Piece]) -> dict:
        choice = S.ChatChoice(
            message=S.ChatMessageOut(content="".join(p.text for p in got)),
            finish_reason=self.outcome.finish_reason,
            logprobs=self._logprobs(got),
        )
        return S.ChatCompletionResponse(
            id=self.id, created=self.created, model=self.req.model, choices=[choice], usage=self._usage()
        ).model_dump()

    async def events(self, pieces: AsyncIterator[Piece]) -> AsyncIterator[dict]:
        yield self._chunk(S.ChatDelta(role="assistant", content=""), None)
        async for p in pieces:
            if p.finish_reason == "error":
                yield ended_in_error(self.outcome).body()
                return
            yield self._chunk(S.ChatDelta(content=p.text), p.finish_reason, self._logprobs([p]) if p.logprobs else None)
        if self.req.stream_options and self.req.stream_options.include_usage:
            yield usage_chunk(self._chunk(S.ChatDelta(), None), self._usage())

    def _chunk(self, delta: S.ChatDelta, finish: str | None, logprobs: dict | None = None) -> dict:
        out = S.ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.req.model,
            choices=[S.ChatChunkChoice(delta=delta, finish_reason=finish, logprobs=logprobs)],
        ).model_dump(exclude={"usage"})
        out["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
        return out

    def _logprobs(self, got: list[Piece]) -> dict | None:
        if self.req.top_n() is None:
            return None
        ids, lps = [t for p in got for t in p.token_ids], [x for p in got for x in (p.logprobs or ())]
        return chat_entries(self.tokenizer, ids, lps)

    def _usage(self) -> S.Usage:
        return S.Usage.of(self.prompt_tokens, self.outcome.completion_tokens)
