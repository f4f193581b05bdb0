"""The architecture registry: which decoder class runs a model file or directory.

``family_of(path)`` reads the family from a GGUF's ``general.architecture`` or a Hugging Face ``config.json``'s
``model_type``; ``decoder_class(path)`` maps it to the class whose ``from_path`` loads it. The Llama family
(``llama``, ``qwen3``; ``oasis_exec.model.decoder.Decoder``) and Gemma 3 (``gemma3``, ``gemma3_text``;
``oasis_exec.model.gemma3.Gemma3Decoder``, hybrid sliding-window attention). An unknown family is refused by the loader
it falls to (``read_gguf`` names the supported architectures).
"""

from __future__ import annotations

from . import gemma3  # noqa: F401  (defines and registers Gemma3Decoder)
from .decoder import Decoder, family_of

LLAMA_FAMILY = ("llama", "qwen3", "qwen2", "mistral")
GEMMA3 = ("gemma3", "gemma3_text")


def decoder_class(path: str):
    """The decoder class of the model at ``path``: the one registered for its family (``Decoder.by_family``)."""
    return Decoder.by_family.get(family_of(path), Decoder)
