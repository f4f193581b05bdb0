"""The engine: requests in, tokens out; schedule -> execute (the runner) -> update, each step.

``engine.py`` (``Engine``), ``scheduler.py`` (the executor's accounting for ``oasis_core.scheduler``; torch-free),
``sampling.py`` (greedy, temperature, top-p).
"""
