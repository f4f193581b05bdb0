"""The model: ``decoder.py`` (Qwen3 / Llama decoder pieces), ``draft.py`` (EAGLE-3-style head), ``gguf.py`` (GGUF
weights), ``tensor_parallel.py`` (sharding over ranks)."""
