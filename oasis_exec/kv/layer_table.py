"""Per-layer state held for a hybrid model's full-attention layers only, indexed by the model's layer.

The stores keep, per layer, tables of the layer's whole context: the block summaries (``kmin`` / ``kmax``
[L, B_max, H, NB_max, D]) and the working set's maps (``resident`` / ``last_sel`` [L, B_max * H, S]). A sliding-window
layer (``ModelSpec.layer_windows``) has none of them (its KV is a ring, ``oasis_exec.kv.ring``), so in a hybrid model
they are allocated for the full layers only (``table``), ``[n_full, ...]``, and ``FullLayers`` maps the model's layer
to its row of that tensor: ``t[l]``, ``t[l, lane, ...]`` read and ``t[l, ...] = x`` writes row ``l`` of the model as
the ``[L, ...]`` tensor did; ``t[:, ...]`` is every held layer (``held`` in order). Indexing a sliding layer is an
error. A model without windows keeps the plain ``[L, ...]`` tensor (``table`` returns it), so nothing changes there.
"""

from __future__ import annotations

import torch


class FullLayers:
    def __init__(self, data: torch.Tensor, held, name: str):
        self.data, self.held, self.name = data, tuple(held), name  # data [len(held), ...]
        self._row = {l: i for i, l in enumerate(self.held)}

    def _key(self, key):
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if isinstance(first, slice):
            if first != slice(None):
                raise IndexError(f"{self.name}: a layer range other than ':' is not held in model order")
            i = first
        else:
            try:
                i = self._row[int(first)]
            except KeyError:
                raise IndexError(f"{self.name}: layer {first} is a sliding-window layer, it has none") from None
        return (i, *rest) if rest else i

    def __getitem__(self, key):
        return self.data[self._key(key)]

    def __setitem__(self, key, value) -> None:
        self.data[self._key(key)] = value

    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def clone(self) -> FullLayers:
        return FullLayers(self.data.clone(), self.held, self.name)

    def copy_(self, other) -> FullLayers:
        self.data.copy_(other.data if isinstance(other, FullLayers) else other)
        return self


def table(n_layers: int, held, shape, fill, dtype, device, name: str):
    """A per-layer table of ``shape`` a layer filled with ``fill``: ``[n_layers, *shape]`` when every layer is held
    (``held`` None or all of them), else ``FullLayers`` over ``[len(held), *shape]``."""
    layers = tuple(range(n_layers)) if held is None else tuple(held)
    data = torch.full((len(layers), *shape), fill, dtype=dtype, device=device)
    return data if layers == tuple(range(n_layers)) else FullLayers(data, layers, name)
