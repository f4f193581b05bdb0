"""OasisKV's PyTorch + Triton executor, in folders by one decode step's data flow (docs/structures.md says why):

- ``engine/``      requests in, tokens out: ``Engine`` (schedule -> execute -> update), the torch-free scheduler side.
- ``runner/``      one engine's GPU state and the layer loop: ``Runner.execute``, ``ModelExec`` (the forward passes),
  CUDA graphs, speculative decoding, sampling, kernel dispatch (``ops.py``: ``oasis_kernels`` on CUDA, references
  elsewhere).
- ``workingset/``  which KV blocks each row attends: the ``Prefetcher`` (predict -> select -> fetch on side streams),
  the fetch cap on the device, synthetic / replayed / recorded selections.
- ``transfer/``    host <-> GPU bytes: the UVA gather, the host gather + DMA, the inline copy, write-back, ``transfer=auto``.
- ``kv/``          the stores (pinned host pool, GPU slot pool, tables, summaries, paged cache) and their sizes.
- ``model/``       decoder pieces, the EAGLE-3-style draft head, GGUF weights, tensor-parallel sharding.
- ``server/``      the OpenAI-compatible server (``python -m oasis_exec serve``).
- ``tools/``       bench, recorder, quality studies, draft training, split and TP checks; the runtime never imports them.
- ``config.py``    ``ExecConfig`` / ``BenchConfig``: frozen, validated dataclasses whose field help is the CLI's.
- ``__main__.py``  ``python -m oasis_exec bench|generate|serve|quality``.
"""
