"""The working set: which KV blocks a step attends and how they reach the GPU slots.

``base.py`` (the ``WorkingSet`` interface a mode family implements), ``families.py`` (the registry), the families
``paged.py``, ``resident.py`` (+ ``first_fill.py``, ``commit.py``), ``hot_cache.py``, ``window.py``; ``step.py`` and
``selector.py`` (what a step's layers read; block scores and top-K); ``prefetcher.py`` (per layer predict -> select
-> transfer, with ``select_buffers.py`` and ``graph_copies.py``), ``fetch_caps.py`` (the fetch-cap policy on the
device), ``selection_sources.py`` (synthetic, replayed and recorded selections), ``spec_pipeline.py`` (the prediction
beside a speculative verify pass).
"""
