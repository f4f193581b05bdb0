"""Incremental detokenisation equals full decoding, on random token streams fed in random slices: the byte
tokenizer, the real model's GGUF tokenizer (byte-level BPE) and the window detokenizer of other tokenizers."""

from __future__ import annotations

import random

import pytest

from oasis_exec.server.tokenizer import _BYTE_OF, ByteTokenizer, _WindowDetokenizer


def _incremental(detok, ids: list[int], rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(0, 3)  # empty pushes too
        out.append(detok.push(ids[i : i + n]))
        i += n
    return out + [detok.flush()]


def _streams(rng: random.Random, pick, n: int = 400):
    for _ in range(n):
        yield [pick() for _ in range(rng.randint(1, 40))]


def test_byte_tokenizer_detokenizer_equals_decode():
    tok, rng = ByteTokenizer(), random.Random(0)
    utf8 = list("héllo → wörld ✓ 日本 🙂".encode())
    for ids in _streams(rng, lambda: rng.choice(utf8) if rng.random() < 0.7 else rng.randrange(512)):
        pieces = _incremental(tok.detokenizer(), ids, rng)
        assert "".join(pieces) == tok.decode(ids)
    text = "日本語 🙂 ok"
    pieces = [p for p in _incremental(tok.detokenizer(), tok.encode(text), rng) if p]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)  # never a split character


def test_window_detokenizer_equals_decode():
    tok, rng = ByteTokenizer(), random.Random(1)
    utf8 = list("ß → ✓ 🙂".encode())
    for ids in _streams(rng, lambda: rng.choice(utf8) if rng.random() < 0.8 else rng.randrange(256)):
        assert "".join(_incremental(_WindowDetokenizer(tok.decode), ids, rng)) == tok.decode(ids)


@pytest.fixture(scope="module")
def gguf_tokenizer():
    pytest.importorskip("tokenizers")
    from oasis_exec.model.gguf import smollm2_path
    from oasis_exec.server.tokenizer import load_tokenizer

    try:
        return load_tokenizer(smollm2_path())
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_gguf_tokenizer_detokenizer_equals_decode(gguf_tokenizer):
    tok, rng = gguf_tokenizer, random.Random(2)
    vocab = tok._tok.get_vocab_size()
    byte_tokens = [i for i in (tok._tok.token_to_id(c) for c in _BYTE_OF) if i is not None]  # lone bytes
    special = sorted(tok._skipped)
    assert len(byte_tokens) > 200 and special

    def pick() -> int:
        u = rng.random()
        return rng.choice(byte_tokens) if u < 0.5 else rng.choice(special) if u < 0.6 else rng.randrange(vocab)

    for ids in _streams(rng, pick):
        assert "".join(_incremental(tok.detokenizer(), ids, rng)) == tok.decode(ids)
    text = "Grüße, 世界! 🙂 <|im_end|> done"
    ids = tok.encode(text, add_special_tokens=False)
    assert "".join(_incremental(tok.detokenizer(), ids, rng)) == tok.decode(ids)
    assert b"".join(tok.token_bytes(i) for i in tok.encode("Grüße 🙂", add_special_tokens=False)) == "Grüße 🙂".encode()


def test_window_detokenizer_does_constant_work_a_token():
    calls = []

    def decode(ids):
        calls.append(len(ids))
        return ByteTokenizer().decode(ids)

    detok = _WindowDetokenizer(decode)
    for i in range(2000):
        detok.push([97 + i % 26])
    assert max(calls) <= 2  # each push decodes a window of the last token or two, never the whole output
