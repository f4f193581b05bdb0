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
