"""Tokenizers for the server: a Hugging Face tokenizer from the model directory, or a byte-level one.

A dummy (random-weight) model has no vocabulary, so it is served with `ByteTokenizer`: text is encoded as its
UTF-8 bytes (ids 0..255); an id of 256 or more, which random weights do emit, decodes as the byte `id % 256`.
`describe()` states which tokenizer is in use; `/v1/models` reports it.

Streaming needs incremental decoding that never splits a multi-byte character: `Detokenizer` takes ids as they
arrive and returns only text that is final, so the concatenated deltas equal the decoding of all ids.
"""

from __future__ import annotations

import codecs
import importlib.util
import json
from pathlib import Path
from typing import Protocol, Sequence


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def detokenizer(self) -> "Detokenizer": ...

    def describe(self) -> str: ...


class Detokenizer(Protocol):
    def push(self, ids: Sequence[int]) -> str:
        """Feed new ids; return the text they complete (possibly empty)."""

    def flush(self) -> str:
        """Return whatever text is still held back (end of the request)."""


class ByteTokenizer:
    """UTF-8 bytes as tokens; ids >= 256 alias byte `id % 256`. No EOS: a dummy model stops on length."""

    eos_token_ids: tuple[int, ...] = ()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")

    def detokenizer(self) -> "_ByteDetokenizer":
        return _ByteDetokenizer()

    def describe(self) -> str:
        return "byte-level (UTF-8 bytes are ids 0-255; id >= 256 decodes as byte id % 256)"


class _ByteDetokenizer:
    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Sequence[int]) -> str:
        return self._dec.decode(bytes(int(i) % 256 for i in ids))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class HFTokenizer:
    """A `tokenizers` tokenizer loaded from `tokenizer.json` in a model directory."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer as _Tok  # optional dependency, imported only when used

        self._tok = _Tok.from_file(str(model_dir / "tokenizer.json"))
        self._path = model_dir / "tokenizer.json"
        self.eos_token_ids = _eos_ids(model_dir, self._tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def detokenizer(self) -> "_PrefixDetokenizer":
        return _PrefixDetokenizer(self.decode)

    def describe(self) -> str:
        return f"huggingface tokenizers ({self._path})"


class _PrefixDetokenizer:
    """Decode the whole sequence each time and emit the new suffix; hold back a trailing partial character."""

    def __init__(self, decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, ids: Sequence[int]) -> str:
        self._ids.extend(int(i) for i in ids)
        text = self._decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        return self._take(text)

    def flush(self) -> str:
        return self._take(self._decode(self._ids))

    def _take(self, text: str) -> str:
        new = text[self._emitted :]
        self._emitted = len(text)
        return new


def _eos_ids(model_dir: Path, tok) -> tuple[int, ...]:
    ids: list[int] = []
    cfg = model_dir / "config.json"
    if cfg.exists():
        eos = json.loads(cfg.read_text()).get("eos_token_id")
        ids.extend(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    tcfg = model_dir / "tokenizer_config.json"
    if tcfg.exists():
        name = json.loads(tcfg.read_text()).get("eos_token")
        name = name.get("content") if isinstance(name, dict) else name
        if isinstance(name, str) and tok.token_to_id(name) is not None:
            ids.append(tok.token_to_id(name))
    return tuple(dict.fromkeys(ids))


def load_tokenizer(model_dir: str | None) -> Tokenizer:
    """The model directory's tokenizer when it has one and `tokenizers` is installed, else `ByteTokenizer`."""
    if model_dir is not None:
        path = Path(model_dir)
        if (path / "tokenizer.json").exists() and importlib.util.find_spec("tokenizers") is not None:
            return HFTokenizer(path)
    return ByteTokenizer()
