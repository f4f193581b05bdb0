"""Pydantic models of the OpenAI-compatible API: requests (validated strictly) and responses.

Requests are strict: a wrongly typed field is an error rather than silently coerced ("5" is not an integer).
Nothing is silently ignored: a parameter the server does not implement is a 400 naming it (`errors.py`), and so is
an OpenAI parameter given a value other than its no-op one (`frequency_penalty` other than 0, `n` > 1, `tools`,
...); its no-op value is accepted. An explicit `null` is accepted for every optional top-level field and means
"the default".
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_MAX_TOKENS = 16  # completions, as OpenAI; chat defaults to the rest of the context
MAX_STOP_STRINGS = 4
MAX_LOGPROBS = 20  # top alternatives a token, at most
MAX_PROMPTS = 256  # prompts of one completions request (a batch), at most
_REQUIRED = ("model", "prompt", "messages")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


def _noop(value: Any):
    """A parameter this server implements only at its no-op value (which changes nothing)."""

    def check(v: Any) -> Any:
        if v != value or isinstance(v, bool) != isinstance(value, bool):
            raise ValueError(f"this server implements only the value {json.dumps(value)}")
        return v

    return AfterValidator(check)


class StreamOptions(_Strict):
    include_usage: bool = False


def _check_stop(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ValueError("must be a string or an array of strings")
    if len(v) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(v)}")
    if any(s == "" for s in v):
        raise ValueError("stop strings must not be empty")
    return v


class _SamplingFields(_Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: Any = Field(default=None, validate_default=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)
    seed: int | None = None
    user: str | None = None  # an end-user id for the caller's own bookkeeping: nothing to do with it
    frequency_penalty: Annotated[float, _noop(0)] = 0.0
    presence_penalty: Annotated[float, _noop(0)] = 0.0
    logit_bias: Annotated[dict, _noop({})] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k in _REQUIRED}
        return data

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: Any) -> list[str]:
        return _check_stop(v)

    def top_n(self) -> int | None:
        """Alternatives to report a token (None: no logprobs asked)."""
        raise NotImplementedError


class CompletionRequest(_SamplingFields):
    """`POST /v1/completions`: `prompt` is text or a list of token ids, or a batch: a list of those (one choice a
    prompt, `index` in order; each prompt is a request of its own, run concurrently).

    `logprobs` N: each token's log-probability and the N most likely alternatives; `echo`: the prompt is returned
    before the completion (with its tokens' log-probabilities when `logprobs` is set); `max_tokens` 0 with `echo`
    scores the prompt without generating."""

    prompt: Any
    max_tokens: int | None = Field(default=None, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: Annotated[int, _noop(1)] = 1
    suffix: Annotated[str, _noop("")] = ""

    @model_validator(mode="after")
    def _zero_tokens_needs_echo(self) -> "CompletionRequest":
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 is only meaningful with echo (scoring the prompt)")
        return self

    def top_n(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> str | list[int] | list:
        if isinstance(v, list) and v and all(isinstance(p, (str, list)) for p in v):
            if len(v) > MAX_PROMPTS:
                raise ValueError(f"at most {MAX_PROMPTS} prompts a request, got {len(v)}")
            return [_one_prompt(p) for p in v]  # a batch: one choice a prompt, in order
        return _one_prompt(v)

    def prompts(self) -> list:
        """The prompts of the request: one, or the batch's (texts or token id lists), in order."""
        one = isinstance(self.prompt, str) or all(isinstance(t, int) for t in self.prompt)
        return [self.prompt] if one else list(self.prompt)


def _one_prompt(v: Any) -> str | list[int]:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        if any(t < 0 for t in v):
            raise ValueError("token ids must be >= 0")
        return v
    raise ValueError("must be a string, a non-empty array of integer token ids, or an array of those")


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = ""
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in v):
            if not all(isinstance(p.get("text"), str) for p in v):
                raise ValueError("every text part needs a string 'text'")
            return "".join(p["text"] for p in v)
        raise ValueError("must be a string or an array of text parts")


class ChatCompletionRequest(_SamplingFields):
    """`POST /v1/chat/completions`; `max_completion_tokens` is accepted as a synonym of `max_tokens`, and without
    either the completion may take the rest of the context. `logprobs` true: each token's log-probability, with the
    `top_logprobs` most likely alternatives."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: Annotated[list, _noop([])] = Field(default_factory=list)
    tool_choice: Annotated[str, _noop("none")] = "none"
    parallel_tool_calls: bool = True  # meaningless without tools
    response_format: Annotated[dict, _noop({"type": "text"})] = Field(default_factory=lambda: {"type": "text"})
    store: Annotated[bool, _noop(False)] = False

    @model_validator(mode="after")
    def _max_tokens_alias(self) -> "ChatCompletionRequest":
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs set to true")
        return self

    def top_n(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# ---- responses ----


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> "Usage":
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict | None = None  # logprobs.CompletionLogprobs
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: dict | None = None  # logprobs.chat_entries
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: dict | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "oasiskv"
    max_model_len: int
    vocab_size: int
    tokenizer: str
    dummy: bool
    mode: str
    device: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
