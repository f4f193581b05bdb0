"""What every CUDA-graph capture of the executor needs (the decode step's graphs, ``runner.decode_graphs``; the UVA
path's copy graphs, ``transfer.uva``): ``no_gc``, no garbage collection inside a capture."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def no_gc():
    """No garbage collection inside: one that frees CUDA objects (a dropped engine's graphs, events, memory) during
    a stream capture invalidates the capture ("operation failed due to a previous error during capture"). Collects
    first, so a capture starts with no such garbage pending."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def freeze_startup_objects() -> int:
    """Collect, then move every object alive now into the collector's permanent generation (``gc.freeze``), as a
    long-running process does once its engine is built: the model load leaves ~680,000 tracked objects (SmolLM2 with
    its head, CPU, 2026-12-06), which every full collection then walks — 140-180 ms a collection on this CPU, after
    the freeze 0.01 ms. A full collection inside a decode step makes that step that long. It was suspected of the one
    step of 211-234 ms among steps of 7 ms in SmolLM2's beside runs on the H100 (1dc31ae / 1d44039); with the freeze
    that step is still there (92.7 ms, f8b34cd) while the timed collections add up to 0.68 ms (bench's gc_timed), so
    it has another cause (experiments/speculative_decoding/README.md). The
    frozen objects are still freed by reference counting; only cycles among them wait. For the serving and bench entry
    points (the server once; the bench for its run, ``gc.unfreeze`` after), not for tests that build many engines.
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
