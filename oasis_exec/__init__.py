"""OasisKV's PyTorch + Triton executor.

Module map (files named by role):

- ``config.py``    ``ExecConfig``: one frozen, validated dataclass; its field help is the CLI's.
- ``model.py``     Qwen3 / Llama decoder pieces (RMSNorm, RoPE, GQA, SwiGLU, q/k norm), random or HF safetensors weights.
- ``draft.py``     EAGLE-3-style draft head in the published weight layout (fc, midlayer, lm_head, d2t/t2d).
- ``kv_store.py``  pinned host pool, sparse GPU slot pool + per-head mapping + summaries, paged dense cache.
- ``pipeline.py``  per-layer prediction -> selection -> transfer on side streams (UVA gather or host gather + DMA).
- ``writeback.py`` device-decided copy of filled local blocks to the host pool (UVA kernel).
- ``ops.py``       kernel dispatch: ``oasis_kernels/`` on CUDA, their torch references elsewhere.
- ``scheduler.py`` torch-free: the executor's side of ``oasis_core.scheduler`` (lanes + host blocks accounting,
  request state) and ``RunnerCall``, what one runner call executes.
- ``runner.py``    the facade the engine uses: executes a ``RunnerCall`` (prefill chunk or decode step) with
  ``kv_layout.py`` (the stores and their sizes from the GPU budget and the host's memory), ``model_exec.py`` (the
  forward passes: prefill, the per-layer decode step, prediction), ``decode_graphs.py`` (CUDA-graph capture and
  replay of decode steps) and ``selection_sources.py`` (synthetic, replayed and recorded selections).
- ``engine.py``    schedule -> execute -> update; ``add_request`` / ``step`` / ``abort`` / ``stats`` / ``generate``.
- ``sampling.py``  greedy, temperature and top-p sampling with per-request counter-based draws (seeds); the
  runner's default ``TemperatureSampler``.
- ``bench.py``     closed-loop benchmark record; ``recorder.py``: bench results as recordings (traces/SCHEMA.md).
- ``server/``      the OpenAI-compatible server; ``__main__.py``: ``python -m oasis_exec bench|generate|serve``.
"""
