"""What every fetch-cap policy is written against (``oasis_core.fetchcap`` is the registry of the shipped ones and
the guide): ``CapContext`` (what a step tells a policy), ``FetchCapPolicy`` (the base: ``max_cap`` and ``cap``),
``ratio_cap``, the array helpers ``state_array`` / ``assign`` / ``split_budget``, and the registry's
``register_policy`` with the spec parsing helpers ``parse_fields`` / ``spec_of``. The shipped policies and a user's
policy module import from here, and ``fetchcap`` imports the shipped ones, so no module imports its importer.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .echo import show
from .xp import is_torch, namespace

DEFAULT_FETCH_RATIO = 0.05  # paper default: 0.05 of K, about 6 blocks per head per step at K = 128


@dataclass(frozen=True)
class CapContext:
    """What a policy may look at when it picks this step's cap.

    step: decode step index (0 = first decode step after admission).
    top_k: K, selectable blocks per row.
    rows: R, rows of (request, layer, KV head) planned this step.
    drift_so_far: array [R] of cumulative missing blocks per row up to the previous step, or None when the caller
        does not track it.
    n_missing: array [R] of missing blocks per row this step (``|P \\ R|``), or None when unknown yet.
    bytes_moved_total: bytes fetched into the GPU so far (all rows, all steps).
    last_step_time_s: wall (or simulated) time of the previous step in seconds, None before the first: a float, or a
        0-d float64 array on the caller's device (the executor's step clock, ``oasis_exec.workingset.fetch_caps``: read without a
        host synchronisation; a policy then computes with array operations, as it does on ``n_missing``).
    link_bytes_per_s: bandwidth of the link the blocks cross, bytes per second, None when unknown.
    bytes_per_block_head: bytes of one block of one KV head (K and V), None when unknown.
    row_weight: how many rows of the step each context row stands for (1 when the caller plans every row, as the
        executor would; the simulator samples rows and sets it to the rows each sampled row represents). A byte
        budget over the whole step is divided by it before it is split over the context rows.
    n_predicted: array [R] of valid (non -1) entries of each row's predicted set, or None when unknown.
    layer: the layer index of every row of this call (the executor plans one layer per call), or None when the rows
        span all ``layers`` layers in layer-major order, ``R / layers`` rows each (the simulator's sampled layers).
    layers: layers the per-layer state spans (executor: the model's layers; simulator: ``policy_layers``).
    row_state: float64 array [R, W] of this call's rows, W = ``len(policy.row_state_init(K))``, or None when the
        policy keeps none. The caller keeps it from step to step (initialised with ``state_array``); the policy
        reads and updates it in place (``assign``), on the rows' device, without a host synchronisation.
    layer_state: float64 array [layers, V], V = ``len(policy.layer_state_init(K))``, kept like ``row_state``.
    """

    step: int
    top_k: int
    rows: int
    drift_so_far: Optional[Any] = None
    n_missing: Optional[Any] = None
    bytes_moved_total: float = 0.0
    last_step_time_s: Optional[Any] = None
    link_bytes_per_s: Optional[float] = None
    bytes_per_block_head: Optional[int] = None
    row_weight: float = 1.0
    n_predicted: Optional[Any] = None
    layer: Optional[int] = None
    layers: int = 1
    row_state: Optional[Any] = None
    layer_state: Optional[Any] = None

    def __post_init__(self):
        if self.step < 0:
            raise ValueError(f"CapContext.step: must be >= 0, got {self.step}")
        if self.top_k < 0:
            raise ValueError(f"CapContext.top_k: must be >= 0, got {self.top_k}")
        if self.rows < 0:
            raise ValueError(f"CapContext.rows: must be >= 0, got {self.rows}")
        if not (isinstance(self.row_weight, (int, float)) and math.isfinite(self.row_weight) and self.row_weight > 0):
            raise ValueError(f"CapContext.row_weight: must be a finite number > 0, got {show(self.row_weight)}")
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 1:
            raise ValueError(f"CapContext.layers: must be an integer >= 1, got {show(self.layers)}")
        if self.layer is not None and not (isinstance(self.layer, int) and 0 <= self.layer < self.layers):
            raise ValueError(
                f"CapContext.layer: must be None or an integer in [0, {self.layers}), got {show(self.layer)}"
            )


class FetchCapPolicy(ABC):
    """Base of every fetch-cap policy (see the module docstring for the contract).

    ``static``: True when ``cap`` depends on ``ctx.top_k`` only (no runtime state), so a caller may evaluate it once
    and reuse it (the simulator's ``policy_sampling='profile'`` precomputes per-step figures before any step is
    timed). Default False: adaptive policies are stepped with the live context.
    """

    static = False

    @abstractmethod
    def max_cap(self, top_k: int) -> int:
        """Static upper bound of ``cap`` for this K; sizes the per-step transfer buffers."""

    @abstractmethod
    def cap(self, ctx: CapContext):
        """This step's cap: an int for all rows or an integer array [ctx.rows], each in ``[0, max_cap]``."""

    @property
    @abstractmethod
    def spec(self) -> str:
        """The string ``get_policy`` parses back into this policy (recorded with results)."""

    def row_state_init(self, top_k: int) -> tuple:
        """Initial values of one row's state columns (``CapContext.row_state``); () when the policy keeps none."""
        return ()

    def layer_state_init(self, top_k: int) -> tuple:
        """Initial values of one layer's state columns (``CapContext.layer_state``); () when it keeps none."""
        return ()

    def __str__(self) -> str:
        return self.spec


def ratio_cap(ratio: float, top_k: int) -> int:
    """``ratio * top_k`` rounded half up, at least 1 when ``ratio > 0`` (a positive ratio always lets blocks in).

    Paper default: ``ratio_cap(0.05, 128) == 6`` (6.4 rounds to 6, the paper's "about 6 blocks").
    """
    if ratio <= 0 or top_k <= 0:
        return 0
    # The small epsilon makes products such as 0.35 * 10 = 3.4999999999999996 round as the decimal 3.5 does.
    return max(1, min(top_k, math.floor(ratio * top_k + 0.5 + 1e-9)))


def state_array(values: tuple, rows: int, like=None):
    """A float64 array [rows, len(values)], every row ``values``: numpy, or a torch tensor on ``like``'s device."""
    data = [[float(v) for v in values]] * rows
    if like is not None and is_torch(like):
        torch = importlib.import_module("torch")
        return torch.tensor(data, dtype=torch.float64, device=like.device).reshape(rows, len(values))
    return np.asarray(data, dtype=np.float64).reshape(rows, len(values))


def assign(dst, src) -> None:
    """``dst[...] = src`` in place, for a numpy view or a torch tensor (a device copy: no host synchronisation)."""
    if is_torch(dst):
        dst.copy_(src)
    else:
        dst[...] = src


def _num(x: float) -> str:
    """Shortest text that parses back to exactly ``x`` (``:g`` when it round-trips, else ``repr``)."""
    g = f"{x:g}"
    return g if float(g) == float(x) else repr(float(x))


def split_budget(n_missing, budget: int, max_cap: int, min_cap: int = 0):
    """Split ``budget`` blocks over rows in proportion to their missing blocks; integer caps [R].

    n_missing: integer array [R] (numpy or torch, any device); budget: blocks for all these rows together, a host int
    or a 0-d integer array of ``n_missing``'s namespace and device (a budget computed on the device from its step
    time). With the demand ``n_r = min(n_missing_r,
    max_cap)`` (what a row can take), each row gets ``floor(B · n_r / N)`` (``B = min(budget, N)``, ``N = sum n``)
    and the ``B - sum floor`` blocks left over go one each to the rows with the largest remainders (ties: lower row
    first), so ``sum cap == B`` (work-conserving) and ``cap_r <= n_r <= max_cap``. Then the floor
    ``min(n_r, min_cap)`` applies (it takes precedence over the budget: a missing row is never starved). Integer
    arithmetic only: numpy and torch give identical results, torch never synchronises.
    """
    xp = namespace(n_missing)
    n = xp.astype(xp.asarray(n_missing, like=n_missing), xp.int64)
    r = n.shape[0]
    zero = xp.full((), 0, xp.int64, like=n)
    n = xp.minimum(xp.maximum(n, zero), xp.full((), max(int(max_cap), 0), xp.int64, like=n))
    total = xp.sum(n)
    if isinstance(budget, numbers.Real):
        budget = xp.full((), max(int(budget), 0), xp.int64, like=n)
    b = xp.minimum(xp.maximum(xp.astype(budget, xp.int64), zero), total)
    denom = xp.maximum(total, xp.full((), 1, xp.int64, like=n))
    num = b * n
    base = num // denom
    rem = num % denom
    left = b - xp.sum(base)  # in [0, R): the sum of the remainders is left * denom
    order = xp.argsort_desc(rem)
    rank = xp.scatter(xp.zeros((r,), xp.int64, like=n), 0, order, xp.arange(r, like=n))
    cap = base + xp.astype(rank < left, xp.int64)
    return xp.maximum(cap, xp.minimum(n, xp.full((), max(int(min_cap), 0), xp.int64, like=n)))


# -- parsing and registration ------------------------------------------------------------------------------------
# name -> (usage shown in errors, parse(spec, arg) -> policy); arg is the text after ':' or None when there is none.
_REGISTRY: dict[str, tuple[str, Callable[[str, Optional[str]], FetchCapPolicy]]] = {}


def register_policy(name: str, usage: str, parse: Callable[[str, Optional[str]], FetchCapPolicy]) -> None:
    """Make ``get_policy`` (and so the simulator's ``--fetch-policy``) know ``name``.

    parse(spec, arg): ``spec`` is the whole string (for error messages), ``arg`` the text after the first ':'
    (stripped, lower case) or None. It returns the policy or raises ``ValueError`` naming the spec and the bad
    value. The policy's ``spec`` property must parse back to an equal policy.
    """
    name = name.strip().lower()
    if not name or ":" in name:
        raise ValueError(f"register_policy: name must be a non-empty word without ':', got {show(name)}")
    _REGISTRY[name] = (usage, parse)


def parse_fields(spec: str, arg: Optional[str], cls, fields: dict, positional: Optional[str] = None):
    """``cls(**kw)`` from ``arg`` = ``[VALUE,]FIELD=VALUE,...`` (the first bare value is ``positional``); ``fields``
    maps each accepted field to ``int`` or ``float``. Errors name the spec, the field and the value."""
    kw = {}
    parts = [p.strip() for p in arg.split(",")] if arg else []
    if parts and "=" not in parts[0] and positional is not None:
        kw[positional] = parts.pop(0)
    for p in parts:
        key, eq, val = (x.strip() for x in p.partition("="))
        if not eq or key not in fields:
            raise ValueError(
                f"fetch cap {show(spec)}: {show(p)} is not FIELD=VALUE with FIELD one of {', '.join(fields)}"
            )
        if key in kw:
            raise ValueError(f"fetch cap {show(spec)}: {key} given twice")
        kw[key] = val
    for key, val in kw.items():
        try:
            kw[key] = fields[key](val)
        except ValueError:
            kind = "an integer" if fields[key] is int else "a number"
            raise ValueError(f"fetch cap {show(spec)}: {cls.__name__}.{key}: must be {kind}, got {show(val)}") from None
    try:
        return cls(**kw)
    except ValueError as e:
        raise ValueError(f"fetch cap {show(spec)}: {e}") from None


def spec_of(policy, name: str, positional: Optional[str] = None) -> str:
    """``name[:POSITIONAL][,FIELD=VALUE...]`` with only the fields that differ from the class defaults."""
    default = type(policy)()
    out = []
    if positional is not None:
        out.append(_num(getattr(policy, positional)))
    for f in dataclasses.fields(policy):
        v = getattr(policy, f.name)
        if f.name != positional and v != getattr(default, f.name):
            out.append(f"{f.name}={v if isinstance(v, int) else _num(v)}")
    return name + (":" + ",".join(out) if out else "")
