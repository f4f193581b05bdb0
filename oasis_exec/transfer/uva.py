"""The UVA transfer path: a layer's copy list read straight from the pinned host pool by one persistent kernel.

``UvaPath.gather(layer, src, head, dst, programs)`` copies one layer's fixed-shape list on the current stream
(``oasis_kernels.gather.uva_gather``: thread loads; ``ExecConfig.uva_kernel="tma"``: the experimental
``oasis_kernels.gather_tma.tma_gather``); ``programs_for(batch)`` says on how many programs (``transfer="auto"``: the
measured table's choice for that batch). Under CUDA graphs with ``copy_graph`` on, a step's copies are captured as
a graph of their own (``capture``) and launched after each replay of the step (``replay``), tied to the step's graph
by external events (see ``pipeline.py``). An fp8 host pool (``host_kv_dtype="fp8_e4m3"``): the gather reads the codes
and each unit's scale and writes the dequantized values (``oasis_kernels.gather.uva_gather(scales=...)``).
"""

from __future__ import annotations

import torch

from ..capture import no_gc


class UvaPath:
    def __init__(self, *, cfg, store, host, choice, programs: int):
        self.cfg, self.store, self.host = cfg, store, host
        self.choice = choice  # transfer="auto" chose this path from the table (transfer_choice.explain); else None
        self.programs = programs
        self._programs_by_batch = {}  # auto: the table's UVA programs per live batch
        self.copy_graphs = {}  # graph key -> the copies of that step, captured (copy_graph)

    def gather(self, layer, src, head, dst, programs) -> None:
        """The copy of one layer's list on the current stream: ``oasis_kernels.gather.uva_gather`` (thread loads), or
        with ``uva_kernel="tma"`` the experimental ``oasis_kernels.gather_tma.tma_gather`` (TMA tile loads)."""
        host = self.host
        args = (host.k[layer], host.v[layer], src, head, dst, self.store.k[layer], self.store.v[layer])
        if self.cfg.uva_kernel == "tma":  # bf16 pools only (ExecConfig refuses it with an fp8 host copy)
            from oasis_kernels.gather_tma import tma_gather

            tma_gather(*args, n_programs=programs)
        else:
            from oasis_kernels.gather import uva_gather

            sc = (host.k_scale[layer], host.v_scale[layer]) if host.quantized else None
            # fp8: reads codes + scales, writes the slots' dtype
            uva_gather(*args, n_programs=programs, items_per_iter=self.cfg.gather_items_per_iter, scales=sc)

    def programs_for(self, batch: int) -> int:
        """Gather programs for a step of ``batch`` lanes. ``transfer="auto"``: the measured table's choice for that
        batch when it is a UVA entry (the path itself was fixed at construction, for the lane count), so a server
        with many lanes but few live requests uses the programs measured for few; else ``programs``."""
        if self.choice is None:
            return self.programs
        got = self._programs_by_batch.get(batch)
        if got is None:
            from .choice import explain

            c = explain(batch)
            got = c["uva_programs"] if c["entry"] is not None and c["path"] == "uva" else self.programs
            self._programs_by_batch[batch] = got
        return got

    def capture(self, key, layers, *, planned, copied, stream) -> None:
        """Capture the copies of graph ``key``'s step as a graph of their own on ``stream``; per layer, in order:
        wait for ``planned[l]`` (recorded by the step's graph once layer l's copy list is written), gather, record
        ``copied[l]`` (which the next step's graph waits for before layer l attends). ``layers``: (layer, (src,
        head, dst, programs)) as the step's capture registered them."""
        g = torch.cuda.CUDAGraph()
        with no_gc(), torch.cuda.graph(g, stream=stream):
            s = torch.cuda.current_stream()
            for layer, (src, head, dst, progs) in layers:
                s.wait_event(planned[layer])
                self.gather(layer, src, head, dst, progs)
                copied[layer].record()
        self.copy_graphs[key] = g

    def replay(self, key, stream) -> bool:
        """Launch graph ``key``'s copy graph on ``stream``; False when it has none."""
        g = self.copy_graphs.get(key)
        if g is None:
            return False
        with torch.cuda.stream(stream):
            g.replay()
        return True

    def close(self) -> None:
        self.copy_graphs.clear()  # with the runner's graphs: freed at close, never mid-capture
