"""The architecture registry: which decoder class runs a model file or directory.

``family_of(path)`` reads the family from a GGUF's ``general.architecture`` or a Hugging Face ``config.json``'s
``model_type``; ``decoder_class(path)`` maps it to the class whose ``from_path`` loads it. The Llama family
(``llama``, ``qwen3``; ``oasis_exec.model.decoder.Decoder``) and Gemma 3 (``gemma3``, ``gemma3_text``;
``oasis_exec.model.gemma3.Gemma3Decoder``, hybrid sliding-window attention). An unknown family is refused by the loader
it falls to (``read_gguf`` names the supported architectures).
"""

from __future__ import annotations

import json
import os

LLAMA_FAMILY = ("llama", "qwen3", "qwen2", "mistral")
GEMMA3 = ("gemma3", "gemma3_text")


def family_of(path: str) -> str | None:
    """The architecture named by a ``.gguf`` file or a Hugging Face directory (None when neither says)."""
    path = str(path)
    if path.endswith(".gguf"):
        from .gguf import read_gguf

        return str(read_gguf(path).meta.get("general.architecture"))
    cfg = os.path.join(path, "config.json")
    if os.path.isfile(cfg):
        with open(cfg) as fh:
            return json.load(fh).get("model_type")
    return None


def decoder_class(path: str):
    """The decoder class of the model at ``path``."""
    if family_of(path) in GEMMA3:
        from .gemma3 import Gemma3Decoder

        return Gemma3Decoder
    from .decoder import Decoder

    return Decoder
