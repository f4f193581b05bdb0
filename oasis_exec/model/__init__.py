"""The model: ``decoder.py`` (Qwen3 / Llama decoder pieces), ``draft.py`` (EAGLE-3-style head), ``gguf.py`` (GGUF
weights; ``gguf_tensors.py`` their tensor names), ``tensor_parallel.py`` (sharding over ranks)."""

from . import gemma3  # noqa: F401, E402  (registers Gemma3Decoder with Decoder.by_family, for Decoder.from_path)
