"""The array namespace the policies are written against.

Every policy in ``oasis_core`` takes arrays and works on numpy arrays (simulator) and torch tensors (executor,
CPU or CUDA) unchanged. ``namespace(x)`` returns a small object with the handful of operations the policies need,
implemented for the library that owns ``x``. torch is never imported here: a tensor is recognised by its module.

Rules the torch implementation keeps: no ``.item()``, ``.tolist()``, ``.cpu()`` and no Python branching on data,
so a policy step never forces a host synchronisation. Sorting is stable everywhere so that numpy and torch break
ties identically (equal keys keep their index order).
"""

from __future__ import annotations

import importlib

import numpy as np


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


class _Numpy:
    name = "numpy"
    int64 = np.int64
    float32 = np.float32
    float64 = np.float64  # a policy's state and budgets (docs/policies.md: float64 operations in one order)
    bool_ = np.bool_

    def asarray(self, x, dtype=None, like=None):
        return np.asarray(x, dtype=dtype)

    def zeros(self, shape, dtype, like=None):
        return np.zeros(shape, dtype=dtype)

    def full(self, shape, value, dtype, like=None):
        return np.full(shape, value, dtype=dtype)

    def arange(self, n, dtype=np.int64, like=None):
        return np.arange(n, dtype=dtype)

    def argsort_desc(self, x, axis=-1):
        """Stable descending argsort: equal keys keep their original order."""
        # Sorting the negation stably is descending with index order kept among equal keys.
        return np.argsort(-x, axis=axis, kind="stable")

    def argsort_asc(self, x, axis=-1):
        return np.argsort(x, axis=axis, kind="stable")

    def smallest_k(self, x, k: int):
        """Positions of the ``k`` smallest entries of each row of ``x`` [R, W], ascending: ``argsort_asc(x)[:, :k]``
        where a row's entries are distinct (ties: any of the equal entries), without sorting the whole row."""
        if k >= x.shape[-1]:
            return self.argsort_asc(x)[:, :k]
        part = np.argpartition(x, k - 1, axis=-1)[:, :k]
        return np.take_along_axis(part, np.argsort(np.take_along_axis(x, part, axis=-1), axis=-1), axis=-1)

    def take_along(self, x, idx, axis=-1):
        return np.take_along_axis(x, idx, axis=axis)

    def where(self, c, a, b):
        return np.where(c, a, b)

    def maximum(self, a, b):
        return np.maximum(a, b)

    def minimum(self, a, b):
        return np.minimum(a, b)

    def cumsum(self, x, axis=-1):
        return np.cumsum(x, axis=axis)

    def any(self, x, axis=None):
        return np.any(x, axis=axis)

    def sum(self, x, axis=None):
        return np.sum(x, axis=axis)

    def amax(self, x, axis):
        return np.max(x, axis=axis)

    def amin(self, x, axis):
        return np.min(x, axis=axis)

    def astype(self, x, dtype):
        return x.astype(dtype)

    def copy(self, x):
        return x.copy()

    def exp(self, x):
        return np.exp(x)

    def log(self, x):
        return np.log(x)

    def sqrt(self, x):
        return np.sqrt(x)

    def scatter(self, x, axis, idx, src):
        """Return a copy of ``x`` with ``x[..., idx] = src`` along ``axis`` (torch.scatter semantics)."""
        out = x.copy()
        np.put_along_axis(out, idx, src, axis=axis)
        return out

    def concat(self, arrays, axis=-1):
        return np.concatenate(arrays, axis=axis)

    def swapaxes(self, x, a, b):
        return np.swapaxes(x, a, b)

    def member_rows(self, values, pool, max_cells: int = 1 << 24):
        """``values[r, i] in pool[r, :]`` (integer [R, V] / [R, M]) through a membership table a row, when the ids span
        little (block ids: at most ``max_cells`` table cells); None otherwise (the caller sorts and searches). The same
        booleans as the search, without the sort (the simulator's policy profiles ask this every step)."""
        if pool.shape[1] == 0 or values.size == 0:
            return None
        lo = min(int(pool.min()), int(values.min()))
        span = max(int(pool.max()), int(values.max())) - lo + 1
        if pool.shape[0] * span > max_cells:
            return None
        rows = np.arange(pool.shape[0])[:, None]
        table = np.zeros((pool.shape[0], span), dtype=bool)
        table[rows, pool - lo] = True
        return table[rows, values - lo]

    def searchsorted_rows(self, sorted_rows, values):
        """Per row ``r``: left insertion points of ``values[r]`` in ``sorted_rows[r]`` (both integer, [R, M] / [R, V])."""
        if sorted_rows.shape[0] == 0 or sorted_rows.shape[1] == 0:
            return np.zeros(values.shape, dtype=np.int64)
        # One flat search: shift every row into its own disjoint integer range.
        lo = min(int(sorted_rows.min()), int(values.min(initial=0)))
        hi = max(int(sorted_rows.max()), int(values.max(initial=0)))
        span = hi - lo + 2
        m = sorted_rows.shape[1]
        off = np.arange(sorted_rows.shape[0], dtype=np.int64)[:, None] * span
        flat = np.searchsorted((sorted_rows - lo + off).ravel(), (values - lo + off).ravel(), side="left")
        return flat.reshape(values.shape) - np.arange(values.shape[0], dtype=np.int64)[:, None] * m


class _Torch:
    name = "torch"

    def __init__(self):
        # Loaded on first use of a tensor, never at import: oasis_core must import without torch.
        torch = self.t = importlib.import_module("torch")
        self.int64 = torch.int64
        self.float32 = torch.float32
        self.float64 = torch.float64
        self.bool_ = torch.bool

    def _dev(self, like):
        return None if like is None else like.device

    def asarray(self, x, dtype=None, like=None):
        return self.t.as_tensor(x, dtype=dtype, device=self._dev(like))

    def zeros(self, shape, dtype, like=None):
        return self.t.zeros(shape, dtype=dtype, device=self._dev(like))

    def full(self, shape, value, dtype, like=None):
        return self.t.full(shape, value, dtype=dtype, device=self._dev(like))

    def arange(self, n, dtype=None, like=None):
        return self.t.arange(n, dtype=dtype or self.t.int64, device=self._dev(like))

    def argsort_desc(self, x, axis=-1):
        return self.t.sort(x, dim=axis, descending=True, stable=True).indices

    def argsort_asc(self, x, axis=-1):
        return self.t.sort(x, dim=axis, stable=True).indices

    def smallest_k(self, x, k: int):
        """``argsort_asc(x)[:, :k]`` (the executor's path as it was; see the numpy namespace)."""
        return self.argsort_asc(x)[:, :k]

    def take_along(self, x, idx, axis=-1):
        return self.t.take_along_dim(x, idx, dim=axis)

    def where(self, c, a, b):
        return self.t.where(c, a, b)

    def maximum(self, a, b):
        return self.t.maximum(a, b)

    def minimum(self, a, b):
        return self.t.minimum(a, b)

    def cumsum(self, x, axis=-1):
        return self.t.cumsum(x, dim=axis)

    def any(self, x, axis=None):
        return x.any() if axis is None else x.any(dim=axis)

    def sum(self, x, axis=None):
        return x.sum() if axis is None else x.sum(dim=axis)

    def amax(self, x, axis):
        return x.amax(dim=axis)

    def amin(self, x, axis):
        return x.amin(dim=axis)

    def astype(self, x, dtype):
        return x.to(dtype)

    def copy(self, x):
        return x.clone()

    def exp(self, x):
        return self.t.exp(x)

    def log(self, x):
        return self.t.log(x)

    def sqrt(self, x):
        return self.t.sqrt(x)

    def scatter(self, x, axis, idx, src):
        return x.scatter(axis, idx, src)

    def concat(self, arrays, axis=-1):
        return self.t.cat(arrays, dim=axis)

    def swapaxes(self, x, a, b):
        return x.transpose(a, b)

    def searchsorted_rows(self, sorted_rows, values):
        return self.t.searchsorted(sorted_rows.contiguous(), values.contiguous(), side="left")


_NUMPY = _Numpy()
_TORCH = None


def namespace(*arrays):
    """The namespace of the first array argument (torch if it is a tensor, else numpy)."""
    global _TORCH
    for a in arrays:
        if a is not None and is_torch(a):
            if _TORCH is None:
                _TORCH = _Torch()
            return _TORCH
    return _NUMPY
