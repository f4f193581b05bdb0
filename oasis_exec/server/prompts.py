"""From a request's prompt to what the engine runs: token ids checked against the model's context, and `Sampling`.

These run in a worker thread (`EngineLoop.prepare`): tokenising a long prompt takes a while. A prompt's length in
characters bounds its tokens from below, so a text far beyond the context is refused before it is tokenised.
"""

from __future__ import annotations

from . import schemas as S
from .engine_protocol import ModelInfo, Sampling
from .errors import APIError
from .tokenizer import Tokenizer


def prepare(
    info: ModelInfo, tokenizer: Tokenizer, prompt: str | list[int], req: S._SamplingFields, chat: bool = False
) -> tuple[list[int], Sampling | None]:
    """Token ids and sampling of a request; sampling is None for `max_tokens` 0 (an echo that only scores)."""
    ids = _prompt_ids(info, tokenizer, prompt, chat)
    context = info.max_model_len
    if req.max_tokens == 0:
        if len(ids) > context:
            raise _too_long(f"prompt: {len(ids)} tokens exceed the model's context of {context}")
        return ids, None
    if len(ids) >= context:
        raise _too_long(f"prompt: {len(ids)} tokens leave no room in the model's context of {context}")
    max_tokens = req.max_tokens
    if max_tokens is None:
        max_tokens = context - len(ids) if chat else S.DEFAULT_MAX_TOKENS
    if len(ids) + max_tokens > context:
        raise _too_long(
            f"max_tokens: the prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds the model's "
            f"context of {context} tokens",
            param="max_tokens",
        )
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        stop_token_ids=tuple(tokenizer.eos_token_ids),
        seed=req.seed,
        logprobs=req.top_n(),
    )
    return ids, sampling


def chat_prompt(tokenizer: Tokenizer, messages: list[S.ChatMessage]) -> str:
    """The conversation rendered by the model's chat template (400 when there is none, or it refuses them)."""
    try:
        return tokenizer.apply_chat_template([m.model_dump(exclude_none=True) for m in messages])
    except ValueError as exc:  # no template, or the template refused the conversation (raise_exception)
        raise APIError(400, f"messages: {exc}", param="messages", code="invalid_value") from None


def _prompt_ids(info: ModelInfo, tokenizer: Tokenizer, prompt: str | list[int], chat: bool) -> list[int]:
    if isinstance(prompt, str):  # a rendered chat template holds its own special tokens
        at_least = len(prompt) // getattr(tokenizer, "chars_per_token", len(prompt) + 1)
        if at_least > info.max_model_len:  # bounded work: refused before tokenising
            raise _too_long(
                f"prompt: {len(prompt):,} characters are at least {at_least:,} tokens, more than the model's "
                f"context of {info.max_model_len}"
            )
        ids = tokenizer.encode(prompt, add_special_tokens=not chat)
    else:
        ids = list(prompt)
        bad = [t for t in ids if t >= info.vocab_size]
        if bad:
            raise APIError(
                400,
                f"prompt: token id {bad[0]} is outside the vocabulary (size {info.vocab_size})",
                param="prompt",
                code="invalid_value",
            )
    if not ids:
        raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
    return ids


def _too_long(message: str, param: str = "prompt") -> APIError:
    return APIError(400, message, param=param, code="context_length_exceeded")
