"""The runner: one engine's GPU state and the layer loop of a step (prefill chunk, decode, speculative decode).

``runner.py`` (``Runner.execute``), ``model_exec.py`` (the layer loop over the working sets), ``drafts.py`` (the
draft head's state), ``spec_step.py`` and ``speculative.py`` (a speculative step: draft, verify, accept),
``decode_graphs.py`` (CUDA-graph capture and replay), ``sampling.py``; kernel dispatch is ``oasis_exec/ops.py``.
"""
