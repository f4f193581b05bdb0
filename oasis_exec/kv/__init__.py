"""Where the KV lives: ``store.py`` (pinned host pool, GPU slot pool, tables, summaries, paged cache), ``layout.py``
(their sizes from the GPU budget), ``host_memory.py`` (the host pool's size check), ``host_quant.py`` (fp8 host copy)."""
