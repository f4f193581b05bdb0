"""`POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info`: the served model's tokenizer over HTTP, in vLLM's
request and response shapes, so that a harness needs no local copy of it (lm-eval's `local-completions` looks for
`/tokenizer_info` and `/tokenize` and then tokenizes through the server).

- `/tokenize` takes `{"prompt": str, "add_special_tokens": true, "return_token_strs": false}` or a chat
  `{"messages": [...], "add_generation_prompt": true, "add_special_tokens": false}` (the prompt the chat endpoint
  would run) and answers `{"count", "max_model_len", "tokens", "token_strs"}` (`token_strs`: each token's text,
  `bytes:\\xNN` for part of a character, as in completion logprobs; null unless asked).
- `/detokenize` takes `{"tokens": [ids]}` and answers `{"prompt": text}` (special tokens skipped, as completions do).
- `/tokenizer_info` answers `{"tokenizer_class", "eos_token", "bos_token", "pad_token", "unk_token",
  "chat_template", "model_max_length", "vocab_size", ...}` (vLLM's fields are the tokenizer config's; the ones a
  harness reads are these). A token is its text, which `/tokenize` without special tokens maps back to its id.

`model`, when sent, must be the served name (404 otherwise). With `--api-key` these paths need the key, as /v1/* do.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, model_validator

from . import schemas as S
from .context import ServerContext, context_of, parse
from .errors import APIError
from .logprobs import token_text
from .prompts import chat_prompt


class TokenizeRequest(S._Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[S.ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages (their template adds them)
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("prompt: send exactly one of prompt and messages")
        if self.messages is not None and not self.add_generation_prompt:
            raise ValueError("add_generation_prompt: only true is implemented")
        return self


class DetokenizeRequest(S._Strict):
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


router = APIRouter()


@router.post("/tokenize")
async def tokenize(request: Request):
    ctx = context_of(request)
    body = await ctx.read_body(request)

    def run() -> dict:  # a worker thread: tokenising a long text takes a while
        req = parse(body, TokenizeRequest)
        _check_model(ctx, req.model)
        if req.messages is not None:
            text = chat_prompt(ctx.tokenizer, req.messages)
            ids = ctx.tokenizer.encode(text, add_special_tokens=bool(req.add_special_tokens))
        else:
            special = True if req.add_special_tokens is None else req.add_special_tokens
            ids = ctx.tokenizer.encode(req.prompt, add_special_tokens=special)
        strs = [token_text(ctx.tokenizer, t) for t in ids] if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": ctx.info.max_model_len, "tokens": ids, "token_strs": strs}

    return await asyncio.to_thread(run)


@router.post("/detokenize")
async def detokenize(request: Request):
    ctx = context_of(request)
    body = await ctx.read_body(request)
    vocab_size = ctx.info.vocab_size

    def run() -> dict:
        req = parse(body, DetokenizeRequest)
        _check_model(ctx, req.model)
        bad = [t for t in req.tokens if not 0 <= t < vocab_size]
        if bad:
            raise APIError(
                400,
                f"tokens: token id {bad[0]} is outside the vocabulary (size {vocab_size})",
                param="tokens",
                code="invalid_value",
            )
        return {"prompt": ctx.tokenizer.decode(req.tokens)}

    return await asyncio.to_thread(run)


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request):
    ctx = context_of(request)
    return info(ctx.tokenizer, ctx.info.max_model_len, ctx.info.vocab_size)


def _check_model(ctx: ServerContext, model: str | None) -> None:
    """`model` is optional here; when sent, it must be the served name."""
    if model is not None:
        ctx.check_model(model)


def info(tokenizer, max_model_len: int, vocab_size: int) -> dict[str, Any]:
    special = dict(getattr(tokenizer, "special_tokens", None) or {})
    out: dict[str, Any] = {
        "tokenizer_class": type(tokenizer).__name__,
        "source": tokenizer.describe(),
        "model_max_length": max_model_len,
        "vocab_size": vocab_size,
    }
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        out[name] = special.get(name)
    template = getattr(tokenizer, "chat_template", None)
    if template:
        out["chat_template"] = template
    return out
