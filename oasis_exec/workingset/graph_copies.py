"""The copies a captured decode step hands to work outside its graph (``Prefetcher``; see its module docstring):
the host path's graph mode (``graph_host``: the worker's jobs submitted after each replay) and the UVA path's copy
graphs (``copy_graph``: each key's copies captured as a graph of their own on the copy stream). Both are tied to the
step's graph by external events a layer: ``planned[l]`` (recorded by the step once layer l's copy list is written)
and ``copied[l]`` (recorded after that layer's copy; the next step waits on it before layer l attends). ``layers``:
per graph key, the layers captured with what their copies need; ``keep``: tensors a captured graph reads across
streams (moved to the graph after the capture)."""

from __future__ import annotations

import torch


class GraphCopies:
    def __init__(self, *, cfg, route, n_layers: int, cuda: bool, copy_stream=None):
        self.graph_host = self.copy_graph = False
        self.planned = self.copied = None
        self.key, self.layers, self.keep = None, {}, []
        wanted = (
            cuda
            and cfg.mode_spec.background
            and not cfg.profile
            and not cfg.no_transfer
            and (
                route.path == "host"
                or cfg.copy_graph == "on"
                or (cfg.copy_graph == "auto" and (route.choice or {}).get("copy_graph", False))
            )
        )
        if not wanted:
            return
        try:
            self.planned = [torch.cuda.Event(external=True) for _ in range(n_layers)]
            self.copied = [torch.cuda.Event(external=True) for _ in range(n_layers)]
        except TypeError:  # an older torch: the host path stays eager, UVA copies stay in the step's graph
            return
        with torch.cuda.stream(copy_stream):
            for e in self.copied:  # created now: a wait on a never-created event captures nothing
                e.record()
        self.graph_host = route.path == "host"
        self.copy_graph = route.path == "uva"

    def begin(self, key) -> None:
        """The runner is about to capture the step of graph ``key``: layers launched now belong to it."""
        self.key = key
        self.layers[key] = []

    def add(self, layer: int, item) -> None:
        """Layer ``layer`` of the graph being captured, with what its copies need after each replay."""
        self.layers.setdefault(self.key, []).append((layer, item))
