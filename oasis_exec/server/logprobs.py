"""Log-probabilities in the OpenAI response shapes, from the engine's `TokenLogprobs`.

Completions (`logprobs` N): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one entry a token;
the first prompt token of an `echo` has no logprob (null), and `text_offset` is where the token's text starts in
the choice's text. Chat (`logprobs` true, `top_logprobs` N): `{"content": [{"token", "logprob", "bytes",
"top_logprobs": [...]}]}`. A token holding part of a UTF-8 character is shown as `bytes:\\xNN...` in completions
(chat gives its `bytes` anyway).

`CompletionLogprobs` keeps the text offset across calls, so a stream's chunks continue where the last one ended.
"""

from __future__ import annotations

from typing import Sequence

from .engine_protocol import TokenLogprobs
from .tokenizer import Tokenizer


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    raw = tokenizer.token_bytes(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class CompletionLogprobs:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._detok = tokenizer.detokenizer()
        self._offset = 0

    def skip_text(self, text: str) -> None:
        """Text of the choice that no token stands for here (an echoed prompt sent without its logprobs)."""
        self._offset += len(text)

    def entries(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs | None]) -> dict:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tid, lp in zip(token_ids, logprobs):
            out["tokens"].append(token_text(self._tok, tid))
            out["token_logprobs"].append(None if lp is None else lp.logprob)
            out["top_logprobs"].append(None if lp is None else {token_text(self._tok, t): v for t, v in lp.top})
            out["text_offset"].append(self._offset)
            self._offset += len(self._detok.push([tid]))
        return out


def merged_entries(parts: list[dict]) -> dict:
    """Completion entries of consecutive pieces of text, as one."""
    return {k: [v for p in parts for v in p[k]] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def chat_entries(tokenizer: Tokenizer, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]) -> dict:
    def one(tid: int, logprob: float) -> dict:
        raw = tokenizer.token_bytes(tid)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}

    return {
        "content": [
            {**one(t, lp.logprob), "top_logprobs": [one(a, v) for a, v in lp.top]} for t, lp in zip(token_ids, logprobs)
        ],
        "refusal": None,
    }
