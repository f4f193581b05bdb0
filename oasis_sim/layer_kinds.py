"""Per-layer attention kinds for the simulator's step timing: full layers and sliding-window layers.

A hybrid model (``ModelSpec.layer_windows``) mixes full-attention layers with layers that attend a sliding window of
their last W tokens. The engine times a full layer as before (the mode's attention, selection, transfers, summaries
and the draft's lookahead); a windowed layer has none of the sparse machinery: it attends ``min(context, W)``
tokens of every request densely on the GPU. :class:`LayerKinds` gives the engine what differs per kind:

- ``window_tokens(ctxs)``: per distinct window W, ``sum(min(ctx, W))`` over the decoding requests (the KV tokens a
  windowed layer reads);
- ``prefill_past(n, past, W)``: the ``past_tokens`` to ask the predictor's ``attn_prefill`` for, so that its
  ``past + n / 2`` keys a query (the full layer's mean) become a window's mean ``(1/n) ∫ min(W, past + x) dx``;
- ``per_layer(full, by_window)``: a step's per-layer list (``LayerWork`` takes one) from the full layers' value and
  each window's.

For a model without windows the engine never builds lists: its per-layer durations stay the scalars they were.
"""

from __future__ import annotations

from oasis_core.specs import ModelSpec


class LayerKinds:
    """The layer kinds of ``model``: ``windows[l]`` is layer ``l``'s window in tokens, None when it is full."""

    def __init__(self, model: ModelSpec):
        self.windows = tuple(model.layer_window(l) for l in range(model.n_layers))
        self.hybrid = model.is_hybrid
        self.n_full = model.n_full_layers
        self.distinct = tuple(sorted({w for w in self.windows if w is not None}))
        self.count = {w: self.windows.count(w) for w in self.distinct}  # windowed layers per window

    def window_tokens(self, ctxs) -> dict:
        """``{W: sum(min(ctx, W) for ctx in ctxs)}``: the KV tokens each windowed layer reads in a decode step."""
        return {w: sum(c if c < w else w for c in ctxs) for w in self.distinct}

    @staticmethod
    def prefill_past(n: int, past: int, window: int) -> float:
        """``past_tokens`` for ``attn_prefill`` over a chunk of ``n`` tokens after ``past`` in a layer of window
        ``window``: the mean keys a query attends, ``(1/n) ∫_0^n min(W, past + x) dx``, less the ``n / 2`` the
        predictor adds (``past`` itself while the chunk stays inside the window)."""
        if past + n <= window:
            return float(past)
        if past >= window:
            return window - n / 2.0
        a = window - past  # where the chunk's queries reach the window
        mean = (a * past + a * a / 2.0 + (n - a) * window) / n
        return mean - n / 2.0

    def per_layer(self, full: float, by_window: dict) -> list:
        """One value a layer: ``full`` on the full layers, ``by_window[W]`` on a layer of window ``W``."""
        return [full if w is None else by_window[w] for w in self.windows]
