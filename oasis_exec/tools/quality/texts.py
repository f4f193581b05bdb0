"""The evaluation texts under ``traces/texts/`` (README there: source, licence, token counts), by name.

``TEXTS`` names them; ``load_text(name)`` returns the text; ``token_ids(tokenizer, name, n_tokens)`` its first
``n_tokens`` token ids (fewer when the text is shorter). Any tokenizer with ``encode(text)`` works: a Hugging Face
tokenizer (no special tokens are added) or ``oasis_exec.server.tokenizer``'s.
"""

from __future__ import annotations

import os

TEXTS = ("GPL-3", "MPL-2.0", "Apache-2.0", "argparse.py", "shlex.py")
TEXT_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "traces", "texts"
)


def text_path(name: str) -> str:
    if name not in TEXTS:
        raise ValueError(f"text {name!r}: unknown; choose from {', '.join(TEXTS)}")
    return os.path.join(TEXT_DIR, name + ".txt")


def load_text(name: str) -> str:
    with open(text_path(name), encoding="utf-8") as fh:
        return fh.read()


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (BOS/EOS)."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:  # a tokenizer whose encode takes the text only
        ids = tokenizer.encode(text)
    return [int(i) for i in ids]


def token_ids(tokenizer, name: str, n_tokens: int | None = None) -> list[int]:
    """The first ``n_tokens`` ids of text ``name`` (all of them when ``n_tokens`` is None or exceeds its length)."""
    ids = encode(tokenizer, load_text(name))
    return ids if n_tokens is None else ids[:n_tokens]


def hf_tokenizer(model_path: str):
    """The Hugging Face tokenizer of a ``.gguf`` file (from its metadata) or of a model directory."""
    from transformers import AutoTokenizer

    if str(model_path).endswith(".gguf"):
        return AutoTokenizer.from_pretrained(
            os.path.dirname(os.path.abspath(model_path)), gguf_file=os.path.basename(model_path)
        )
    return AutoTokenizer.from_pretrained(model_path)
