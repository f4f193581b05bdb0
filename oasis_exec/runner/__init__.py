"""The runner: one engine's GPU state and the layer loop of a step (prefill chunk, decode, speculative decode).

``runner.py`` (``Runner.execute``), ``model_exec.py`` (the forward passes over the stores), ``decode_graphs.py``
(CUDA-graph capture and replay), ``speculative.py`` (draft, verify, accept), ``ops.py`` (kernel dispatch).
"""
