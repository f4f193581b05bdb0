"""The working set: which KV blocks a step attends and how they reach the GPU slots.

``prefetcher.py`` (per layer predict -> select -> transfer), ``fetch_caps.py`` (the fetch-cap policy on the device),
``selection_sources.py`` (synthetic, replayed and recorded selections).
"""
