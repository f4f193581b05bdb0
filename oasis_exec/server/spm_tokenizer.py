"""A SentencePiece-style tokenizer (``tokenizer.ggml.model`` "llama": pieces with ``▁`` for spaces, byte fallback)
from a GGUF's metadata, built with ``tokenizers`` as transformers 5 builds Gemma's (``GemmaTokenizer`` over
``gguf_tokenizer_mapping.gemma_tokenizer``):

- a BPE model with byte fallback (``<0xXX>`` pieces) and ``<unk>``; its merges are recovered from the vocabulary
  (a GGUF of this kind stores none): every split of a token into two tokens, ranked by the token's position in
  the file (Gemma's scores do not follow its merge order; the order of the tokens does), as transformers'
  ``generate_merges`` ranks them;
- a token of two or more spaces, stored with real spaces, is respelled with ``▁``;
- normalizer: spaces to ``▁`` (no prefix space: ``tokenizer.ggml.add_space_prefix`` false); decoder: ``▁`` to a space,
  byte pieces to bytes (invalid UTF-8 as U+FFFD each), fused;
- control tokens (``token_type`` 3) special, user-defined ones (4: ``\\n``, runs of newlines, ...) added whole;
  BOS prepended when ``tokenizer.ggml.add_bos_token``.

``piece_bytes(piece)`` is a piece's own bytes (``<0xE2>`` is the byte 0xE2, ``▁`` a space): a streamed token may
hold part of a character.
"""

from __future__ import annotations

import re

_CONTROL, _USER_DEFINED = 3, 4
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
SPACE = "\u2581"


def _merges(tokens: list[str]) -> list[tuple[str, str]]:
    """transformers' ``generate_merges(vocab, {token: -index})``: each token's splits into two vocabulary tokens,
    ranked by the token's position, then by the left and the right piece's lengths (descending: the sort is
    reversed), the splits of one token ordered by their pieces' ids."""
    vocab = {t: i for i, t in enumerate(tokens)}
    found = []
    for merge, idx in vocab.items():
        local = [(merge[:j], merge[j:]) for j in range(1, len(merge)) if merge[:j] in vocab and merge[j:] in vocab]
        local.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        found.extend((left, right, -idx) for left, right in local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def build_spm(fields: dict, path: str):
    """(``tokenizers.Tokenizer``, special token names {bos_token: "<bos>", ...}) of a GGUF's tokenizer fields."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if fields.get("tokenizer.ggml.add_space_prefix"):
        raise ValueError(f"{path}: tokenizer.ggml.add_space_prefix is not supported (Gemma's tokenizer adds none)")
    raw = [str(t) for t in fields["tokenizer.ggml.tokens"]]
    types = [int(t) for t in (fields.get("tokenizer.ggml.token_type") or [1] * len(raw))]
    tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in raw]

    def token(key):
        i = fields.get(f"tokenizer.ggml.{key}")
        return None if i is None else raw[int(i)]

    unk = token("unknown_token_id") or "<unk>"
    vocab = {t: i for i, t in enumerate(tokens)}
    model = models.BPE(vocab, _merges(tokens), unk_token=unk, fuse_unk=True, byte_fallback=True, dropout=None)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(raw, types) if ty == _CONTROL]
    )
    known = tok.get_vocab()
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, ty in zip(raw, types)
            if ty == _USER_DEFINED and t in known
        ]
    )
    bos = token("bos_token_id")
    if fields.get("tokenizer.ggml.add_bos_token") and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, int(fields["tokenizer.ggml.bos_token_id"]))],
        )
    special = {
        "bos_token": bos,
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
    }
    return tok, special


def piece_bytes(piece: str) -> bytes:
    """A SentencePiece piece's bytes: ``<0xXX>`` the byte, ``▁`` a space, anything else its UTF-8."""
    m = _BYTE_PIECE.match(piece)
    if m:
        return bytes((int(m.group(1), 16),))
    return piece.replace(SPACE, " ").encode("utf-8")
