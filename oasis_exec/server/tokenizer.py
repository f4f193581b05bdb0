"""Tokenizers for the server: the model's own (from its GGUF metadata or its Hugging Face directory), or a byte-level
one for a dummy model.

`HFTokenizer` wraps a `tokenizers` tokenizer with the model's BOS/EOS, special tokens and chat template, rendered
with jinja2 as transformers' `apply_chat_template` renders it. From a `.gguf` file it is built from the
`tokenizer.ggml.*` metadata (byte-level BPE, `tokenizer.ggml.model` "gpt2"; or SentencePiece-style with byte
fallback, "llama", as Gemma's: `spm_tokenizer.py`); anything it cannot build is an error,
never a silent fall back to bytes. A dummy (random-weight) model has no vocabulary, so it is served with
`ByteTokenizer`: text is encoded as its UTF-8 bytes (ids 0..255); an id of 256 or more, which random weights do emit,
decodes as the byte `id % 256`.
`describe()` states which tokenizer is in use; `/v1/models` reports it.

Streaming needs incremental decoding that never splits a multi-byte character: `Detokenizer` takes ids as they
arrive and returns only text that is final, so the concatenated deltas equal the decoding of all ids. It costs
O(1) a token: where decoding is the UTF-8 decoding of the tokens' bytes (the byte tokenizer; byte-level BPE) each
token's bytes go through one incremental UTF-8 decoder; any other tokenizer decodes a short window of recent tokens
(`_WindowDetokenizer`; a SentencePiece byte-fallback tokenizer too: its decoder turns each byte of an invalid UTF-8
run into U+FFFD, which Python's incremental decoder does not, so the window keeps the text equal to `decode`).
`token_bytes(id)` is a token's own bytes (for log-probabilities: a token may hold part of a character; `<0xF0>` is
the byte 0xF0).
"""

from __future__ import annotations

import codecs
import datetime
import functools
import json
from pathlib import Path
from typing import Protocol, Sequence

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types (tokenizer.ggml.token_type)


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict]) -> str:
        """The prompt of a chat, ending with the assistant's header (encode it with add_special_tokens=False)."""

    def decode(self, ids: Sequence[int]) -> str: ...

    def detokenizer(self) -> "Detokenizer": ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def describe(self) -> str: ...


class Detokenizer(Protocol):
    def push(self, ids: Sequence[int]) -> str:
        """Feed new ids; return the text they complete (possibly empty)."""

    def flush(self) -> str:
        """Return whatever text is still held back (end of the request)."""


class ByteTokenizer:
    """UTF-8 bytes as tokens; ids >= 256 alias byte `id % 256`. No EOS: a dummy model stops on length."""

    eos_token_ids: tuple[int, ...] = ()
    chars_per_token = 1  # one token per UTF-8 byte: at least one per character

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def apply_chat_template(self, messages: list[dict]) -> str:
        """The minimal chat template: one `<|role|>` header line per message, then the assistant's header."""
        return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")

    def detokenizer(self) -> "_BytesDetokenizer":
        return _BytesDetokenizer(self.token_bytes)

    def token_bytes(self, token_id: int) -> bytes:
        return bytes((int(token_id) % 256,))

    def describe(self) -> str:
        return "byte-level (UTF-8 bytes are ids 0-255; id >= 256 decodes as byte id % 256)"


class _BytesDetokenizer:
    """Decoding is the UTF-8 decoding (with replacement) of the concatenated bytes of the tokens: one incremental
    decoder holds back an unfinished character until its last byte arrives."""

    def __init__(self, piece) -> None:
        self._piece = piece  # token id -> the bytes it decodes to (b"" for a skipped special token)
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Sequence[int]) -> str:
        return self._dec.decode(b"".join(self._piece(int(i)) for i in ids))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class _WindowDetokenizer:
    """Any tokenizer: decode the tokens since the last emitted boundary (a short window), emit what is new once it
    does not end in an unfinished character."""

    def __init__(self, decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # window start: tokens before it are emitted and no longer decoded
        self._read = 0  # tokens up to here are emitted

    def push(self, ids: Sequence[int]) -> str:
        self._ids.extend(int(i) for i in ids)
        done = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done) :]

    def flush(self) -> str:
        done = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(done) :]


class HFTokenizer:
    """A `tokenizers` tokenizer with the model's special tokens, BOS/EOS and chat template.

    `encode(text)` tokenizes as transformers' `tokenizer(text)` does (the post-processor adds BOS where the model
    asks for it); `encode(text, add_special_tokens=False)` as `apply_chat_template(..., tokenize=True)` does, since
    a chat template writes its own special tokens. `decode` skips special tokens.
    """

    def __init__(
        self, tok, eos_token_ids: Sequence[int], chat_template: str | None, special_tokens: dict, source: str
    ) -> None:
        self._tok = tok
        self._skipped = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}  # decode skips these
        self._byte_level = json.loads(tok.to_str()).get("decoder", {}).get("type") == "ByteLevel"
        self.eos_token_ids = tuple(eos_token_ids)
        self.chat_template = chat_template
        self._special = {k: v for k, v in special_tokens.items() if v is not None}  # bos_token -> "<s>", ...
        self._source = source
        self._spm = False  # SentencePiece pieces (from_gguf sets it): token_bytes reads <0xXX> and ▁

    @classmethod
    def from_dir(cls, model_dir: Path) -> "HFTokenizer":
        """`tokenizer.json`, with `tokenizer_config.json` (special tokens, chat template) and `config.json`."""
        from tokenizers import Tokenizer as _Tok

        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{model_dir}: no tokenizer.json (a real model is never served with the byte tokenizer)"
            )
        from oasis_exec.model.files import ModelFileError, read_json_file

        try:
            tok = _Tok.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a corrupt file
            raise ModelFileError(f"{path}: not a valid tokenizer.json ({' '.join(str(e).split())[:120]})") from None
        tcfg_path = model_dir / "tokenizer_config.json"
        tcfg = read_json_file(str(tcfg_path), "the tokenizer's settings") if tcfg_path.exists() else {}
        special = {
            k: (v.get("content") if isinstance(v, dict) else v) for k, v in tcfg.items() if k in SPECIAL_TOKEN_NAMES
        }
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # named templates: transformers' default is "default"
            template = {t["name"]: t["template"] for t in template}.get("default")
        if (model_dir / "chat_template.jinja").exists():
            template = (model_dir / "chat_template.jinja").read_text()
        return cls(
            tok,
            _eos_ids(model_dir, tok, special.get("eos_token")),
            template,
            special,
            f"huggingface tokenizers ({model_dir.name}/{path.name})",  # no local paths in responses
        )

    @classmethod
    def from_gguf(cls, path: str) -> "HFTokenizer":
        """Byte-level BPE from a GGUF's `tokenizer.ggml.*` metadata (`tokenizer.ggml.model` "gpt2"), as llama.cpp
        and transformers read it: tokens, merges, control tokens (token_type 3) as special tokens, user-defined
        ones (4) as added tokens, the pre-tokenizer named by `tokenizer.ggml.pre`, BOS/EOS and `add_bos_token`,
        and `tokenizer.chat_template`."""
        from tokenizers import AddedToken, decoders, models, processors
        from tokenizers import Tokenizer as _Tok

        from oasis_exec.model.gguf import read_gguf

        f = read_gguf(path).tokenizer_fields()
        kind, pre = f.get("tokenizer.ggml.model"), f.get("tokenizer.ggml.pre")
        if kind == "llama":  # SentencePiece-style with byte fallback (Gemma): oasis_exec.server.spm_tokenizer
            from .spm_tokenizer import build_spm

            tok, special = build_spm(f, path)
            eos = f.get("tokenizer.ggml.eos_token_id")
            out = cls(
                tok,
                () if eos is None else (int(eos),),
                f.get("tokenizer.chat_template"),
                special,
                f"gguf SentencePiece-style BPE with byte fallback ({path})",
            )
            out._spm = True
            return out
        if kind != "gpt2":
            raise ValueError(
                f"{path}: tokenizer.ggml.model {kind!r} is not supported (gpt2: byte-level BPE; llama: SentencePiece)"
            )
        pre_tokenizer = _gguf_pre_tokenizer(pre, path)
        tokens = list(f["tokenizer.ggml.tokens"])
        types = list(f.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        merges = [tuple(m.split(" ")) for m in f["tokenizer.ggml.merges"]]
        tok = _Tok(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
        tok.pre_tokenizer = pre_tokenizer
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _CONTROL]
        )
        tok.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
        )

        def token(key):
            i = f.get(f"tokenizer.ggml.{key}")
            return None if i is None else tokens[int(i)]

        bos = token("bos_token_id")
        if f.get("tokenizer.ggml.add_bos_token") and bos is not None:
            tok.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", special_tokens=[(bos, int(f["tokenizer.ggml.bos_token_id"]))]
            )
        special = {
            "bos_token": bos,
            "eos_token": token("eos_token_id"),
            "unk_token": token("unknown_token_id"),
            "pad_token": token("padding_token_id"),
        }
        eos = f.get("tokenizer.ggml.eos_token_id")
        return cls(
            tok,
            () if eos is None else (int(eos),),
            f.get("tokenizer.chat_template"),
            special,
            f"gguf byte-level BPE, pre-tokenizer {pre!r} ({Path(path).name})",  # no local paths
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # `encode_batch` runs with the interpreter lock released (`encode` holds it for the whole call: a
        # multi-MB prompt froze the event loop, /health included, for seconds); one text, the same tokens
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    @functools.cached_property
    def chars_per_token(self) -> int:
        """Most characters of text one token can stand for: ``len(text) / chars_per_token`` tokens at least, a
        bound the server checks before tokenising (a prompt that cannot fit the context is refused unread). The
        longest vocabulary entry (a byte-level entry's characters are its bytes, at least the text's characters),
        times 4 where a normalizer may compose characters first."""
        longest = max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)
        return max(1, longest) * (1 if self._tok.normalizer is None else 4)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> str:
        if not self.chat_template:
            raise ValueError(
                "this model has no chat template; use /v1/completions, or start the server with --chat-template FILE"
            )
        import jinja2

        try:
            return render_chat_template(self.chat_template, messages, **self._special)
        except jinja2.TemplateError as exc:  # a syntax error, or the template's raise_exception
            raise ValueError(f"chat template: {exc}") from None

    def detokenizer(self) -> "_BytesDetokenizer | _WindowDetokenizer":
        if self._byte_level:
            return _BytesDetokenizer(lambda i: b"" if i in self._skipped else self.token_bytes(i))
        return _WindowDetokenizer(self.decode)

    def token_bytes(self, token_id: int) -> bytes:
        """The token's bytes: byte-level BPE maps each character of the token back to its byte (a token whose
        characters are not all in that alphabet, an added token, is its own UTF-8); special tokens are their
        text."""
        piece = self._tok.id_to_token(int(token_id))
        if piece is None:
            return b""
        if self._spm and int(token_id) not in self._skipped:
            from .spm_tokenizer import piece_bytes

            return piece_bytes(piece)
        if not self._byte_level or int(token_id) in self._skipped:
            return (
                piece.encode("utf-8")
                if int(token_id) in self._skipped
                else self._tok.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")
            )
        out = bytes(_BYTE_OF.get(c, -1) for c in piece) if all(c in _BYTE_OF for c in piece) else None
        return out if out is not None else piece.encode("utf-8")

    def describe(self) -> str:
        return self._source

    @property
    def special_tokens(self) -> dict:
        """The model's special tokens by role (`bos_token`, `eos_token`, ...) -> their text (`/tokenizer_info`)."""
        return dict(self._special)


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable Latin-1 bytes stand for themselves, the other 68 bytes
    for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return {c: b for b, c in chars.items()}


_BYTE_OF = _byte_alphabet()


def _gguf_pre_tokenizer(pre: str | None, path: str):
    """The split of `tokenizer.ggml.pre`, as llama.cpp defines it, before the byte-level BPE."""
    from tokenizers import pre_tokenizers as P

    byte_level = P.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's regex, then bytes -> its alphabet
    if pre == "smollm":  # llama.cpp: \p{N}, then the GPT-2 regex; SmolLM2's tokenizer.json: Digits + ByteLevel
        return P.Sequence([P.Digits(individual_digits=True), byte_level])
    raise ValueError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported (supported: smollm)")


def _eos_ids(model_dir: Path, tok, eos_name: str | None) -> tuple[int, ...]:
    """EOS ids of `generation_config.json` and `config.json` (transformers' generate stops on these) and the
    tokenizer's `eos_token`."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        if (model_dir / name).exists():
            from oasis_exec.model.files import read_json_file

            eos = read_json_file(str(model_dir / name), "the model's EOS tokens").get("eos_token_id")
            ids.extend(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    if eos_name is not None and tok.token_to_id(eos_name) is not None:
        ids.append(tok.token_to_id(eos_name))
    return tuple(dict.fromkeys(ids))


def render_chat_template(
    template: str, messages: list[dict], add_generation_prompt: bool = True, **special_tokens: str
) -> str:
    """Render a chat template as transformers' `apply_chat_template(..., tokenize=False)` does: a sandboxed jinja2
    environment with trim_blocks / lstrip_blocks and loop controls, its `tojson`, `raise_exception` and
    `strftime_now`, and the special tokens (`bos_token`, `eos_token`, ...) as variables."""
    return _compile_template(template).render(
        messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt, **special_tokens
    )


@functools.lru_cache(maxsize=8)
def _compile_template(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    return env.from_string(template)


def load_tokenizer(model_path: str | None) -> Tokenizer:
    """`ByteTokenizer` for a dummy model (`model_path` None); else the model's own tokenizer, from a `.gguf` file's
    metadata or a Hugging Face directory's `tokenizer.json`. A real model never falls back to the byte tokenizer:
    what cannot be built raises (ValueError, FileNotFoundError, ImportError without `tokenizers`)."""
    if model_path is None:
        return ByteTokenizer()
    if str(model_path).endswith(".gguf"):
        return HFTokenizer.from_gguf(str(model_path))
    return HFTokenizer.from_dir(Path(model_path))
