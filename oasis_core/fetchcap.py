"""Fetch-cap policies: how many missing blocks each row may fetch per step (the ``C`` of paper Algorithm 2).

A policy has two faces:

- ``max_cap(top_k) -> int``: a static bound, known before serving starts. Backends size their per-step transfer
  buffers with it (``StepPlan.fetch_block`` is ``[R, max_cap]``), so it must never depend on runtime data.
- ``cap(ctx) -> int or array[R]``: the cap of this step, from a ``CapContext``. Returning an int caps every row
  alike; an array caps each row (request, layer, KV head) separately. Values must lie in ``[0, max_cap(top_k)]``
  (``selection.plan_step`` clips to that range). An array result must be computed with array-namespace operations
  (``oasis_core.xp``) from the context's arrays, never through ``.item()``, ``.tolist()``, ``.cpu()`` or a Python
  branch on array values: on the executor the context arrays live on the GPU and the step must not synchronise.

Adaptive policies (drift-aware, link-rate-aware, byte budgets from paper eq. 3) subclass ``FetchCapPolicy`` and
read whatever they need from the context; callers never change. ``LinkBudget`` is the shipped example: eq. 3's
per-step byte budget ``B_link · T_decode`` split over the rows that miss blocks. ``register_policy`` adds a name to
``get_policy`` (the simulator's ``--fetch-policy``). The other shipped adaptive policies live in their own files:
``fetchcap_drift.DriftAdaptive`` (``drift``), ``fetchcap_layers.PerLayer`` (``per-layer``) and
``fetchcap_recall.RecallTarget`` (``recall``). A policy of your own is registered by a module that
``$OASIS_POLICY_MODULES`` names (``get_policy`` imports it on first use of an unknown name). Researcher guide and
tutorial: ``docs/policies.md``.
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
        0-d float64 array on the caller's device (the executor's step clock, ``oasis_exec.fetch_caps``: read without a
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


@dataclass(frozen=True)
class Fixed(FetchCapPolicy):
    """The same cap every step and row: ``ratio_cap(ratio, K)`` blocks (paper default ratio 0.05)."""

    ratio: float = DEFAULT_FETCH_RATIO
    static = True  # no annotation: a class attribute, not a field

    def __post_init__(self):
        if not (isinstance(self.ratio, (int, float)) and 0.0 <= self.ratio <= 1.0):
            raise ValueError(f"Fixed.ratio: must be a number in [0, 1], got {show(self.ratio)}")

    def max_cap(self, top_k: int) -> int:
        return ratio_cap(self.ratio, top_k)

    def cap(self, ctx: CapContext) -> int:
        return ratio_cap(self.ratio, ctx.top_k)

    @property
    def spec(self) -> str:
        return f"fixed:{self.ratio:g}"


@dataclass(frozen=True)
class Unlimited(FetchCapPolicy):
    """No cap: every missing block is fetched (up to K, the most a row can miss)."""

    static = True

    def max_cap(self, top_k: int) -> int:
        return max(0, top_k)

    def cap(self, ctx: CapContext) -> int:
        return max(0, ctx.top_k)

    @property
    def spec(self) -> str:
        return "unlimited"


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


@dataclass(frozen=True)
class LinkBudget(FetchCapPolicy):
    """Paper eq. 3 as a fetch cap: each step may move ``B_link · T_decode`` bytes, so the transfers planned for the
    next step fit the time the last step gave the link.

    Budget of the context's rows this step, in block-heads::

        budget = floor(link_bytes_per_s · last_step_time_s · link_fraction / (bytes_per_block_head · row_weight))

    split over the rows in proportion to ``min(n_missing, max_cap)`` (``split_budget``: largest remainder,
    ``sum == budget`` while the rows can take more than it), each row floored at ``min(n_missing, min_cap)`` and
    never above ``max_cap(K) = ratio_cap(max_ratio, K)``. Without ``n_missing`` the budget is split evenly. Before the first
    step (no ``last_step_time_s``) or when the link rate or block bytes are unknown it falls back to the fixed cap
    ``ratio_cap(first_ratio, K)``.

    link_fraction: share of the link the fetches may take (> 0; above 1 deliberately oversubscribes it).
    min_cap: per-row floor in blocks (>= 0). It takes precedence over the budget, so the planned bytes may exceed
        the budget by at most ``sum_r min(n_missing_r, min_cap)`` block-heads; 0 makes the budget a hard bound.
    max_ratio: ``max_cap`` as a fraction of K (0, 1]; sizes the executor's per-step transfer buffers.
    first_ratio: fixed cap ratio [0, 1] used when there is no budget yet.
    """

    link_fraction: float = 1.0
    min_cap: int = 1
    max_ratio: float = 0.25
    first_ratio: float = DEFAULT_FETCH_RATIO

    def __post_init__(self):
        def real(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not (real(self.link_fraction) and self.link_fraction > 0):
            raise ValueError(f"LinkBudget.link_fraction: must be a finite number > 0, got {show(self.link_fraction)}")
        if isinstance(self.min_cap, bool) or not isinstance(self.min_cap, int) or self.min_cap < 0:
            raise ValueError(f"LinkBudget.min_cap: must be an integer >= 0, got {show(self.min_cap)}")
        if not (real(self.max_ratio) and 0 < self.max_ratio <= 1):
            raise ValueError(f"LinkBudget.max_ratio: must be a number in (0, 1], got {show(self.max_ratio)}")
        if not (real(self.first_ratio) and 0 <= self.first_ratio <= 1):
            raise ValueError(f"LinkBudget.first_ratio: must be a number in [0, 1], got {show(self.first_ratio)}")

    def max_cap(self, top_k: int) -> int:
        return ratio_cap(self.max_ratio, top_k)

    def budget_blocks(self, ctx: CapContext) -> Optional[int]:
        """Block-heads the context's rows may fetch this step, or None when the context cannot say (first step,
        unknown link rate or block bytes). An int; a 0-d int64 array when the step time is an array (the same
        float64 operations in the same order, so it equals the int of the same time)."""
        t = ctx.last_step_time_s
        if t is None or ctx.link_bytes_per_s is None or not ctx.bytes_per_block_head:
            return None
        budget_bytes = ctx.link_bytes_per_s * t * self.link_fraction
        blocks = budget_bytes / (ctx.bytes_per_block_head * ctx.row_weight)
        if isinstance(t, numbers.Real):
            return max(0, math.floor(blocks))
        xp = namespace(blocks)  # truncation of a value >= 0 is its floor
        return xp.astype(xp.maximum(blocks, xp.full((), 0.0, blocks.dtype, like=blocks)), xp.int64)

    def cap(self, ctx: CapContext):
        c = self.max_cap(ctx.top_k)
        budget = self.budget_blocks(ctx)
        if budget is None:
            return min(ratio_cap(self.first_ratio, ctx.top_k), c)
        if ctx.n_missing is None:
            if isinstance(budget, numbers.Integral):
                return min(max(budget // max(ctx.rows, 1), min(self.min_cap, c)), c)
            xp = namespace(budget)
            even = xp.maximum(budget // max(ctx.rows, 1), xp.full((), min(self.min_cap, c), xp.int64, like=budget))
            return xp.minimum(even, xp.full((ctx.rows,), c, xp.int64, like=budget))
        return split_budget(ctx.n_missing, budget, c, self.min_cap)

    @property
    def spec(self) -> str:
        out = f"budget:{_num(self.link_fraction)}"
        default = LinkBudget()
        for name in ("min_cap", "max_ratio", "first_ratio"):
            v = getattr(self, name)
            if v != getattr(default, name):
                out += f",{name}={v if name == 'min_cap' else _num(v)}"
        return out


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


def _parse_fixed(spec, arg):
    if arg is None:
        return Fixed()
    try:
        ratio = float(arg)
    except ValueError:
        raise ValueError(f"fetch cap {show(spec)}: ratio must be a number in [0, 1], got {show(arg)}") from None
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"fetch cap {show(spec)}: ratio must be a number in [0, 1], got {show(arg)}")
    return Fixed(ratio)


def _parse_unlimited(spec, arg):
    if arg is not None:
        raise ValueError(f"fetch cap {show(spec)}: 'unlimited' takes no argument")
    return Unlimited()


def _parse_budget(spec, arg):
    if arg is None or arg == "":
        return LinkBudget()
    parts = [p.strip() for p in arg.split(",")]
    kw = {}
    if "=" not in parts[0]:
        kw["link_fraction"] = parts.pop(0)
    for p in parts:
        key, eq, val = (x.strip() for x in p.partition("="))
        if not eq or key not in ("link_fraction", "min_cap", "max_ratio", "first_ratio"):
            raise ValueError(
                f"fetch cap {show(spec)}: {show(p)} is not FIELD=VALUE with FIELD one of link_fraction, "
                "min_cap, max_ratio, first_ratio"
            )
        if key in kw:
            raise ValueError(f"fetch cap {show(spec)}: {key} given twice")
        kw[key] = val
    for key, val in kw.items():
        try:
            kw[key] = int(val) if key == "min_cap" else float(val)
        except ValueError:
            kind = "an integer" if key == "min_cap" else "a number"
            raise ValueError(f"fetch cap {show(spec)}: LinkBudget.{key}: must be {kind}, got {show(val)}") from None
    try:
        return LinkBudget(**kw)
    except ValueError as e:
        raise ValueError(f"fetch cap {show(spec)}: {e}") from None


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


register_policy("fixed", "fixed[:RATIO]", _parse_fixed)
register_policy("unlimited", "unlimited", _parse_unlimited)
register_policy("budget", "budget[:FRACTION][,min_cap=N][,max_ratio=R][,first_ratio=R]", _parse_budget)


def policy_names() -> tuple:
    """Registered policy names, in registration order."""
    return tuple(_REGISTRY)


POLICY_MODULES_ENV = "OASIS_POLICY_MODULES"
_loaded_modules: set = set()  # entries of $OASIS_POLICY_MODULES imported by this process


def _import_policy_module(entry: str) -> None:
    """Import one entry of ``$OASIS_POLICY_MODULES``: a ``.py`` file path (relative to the working directory; the
    module is named after the file) or an importable module name. Any failure is a ``ValueError`` naming it."""
    import importlib.util
    import sys
    from pathlib import Path

    try:
        if entry.endswith(".py"):
            path = Path(entry).resolve()
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            name = path.stem
            have = sys.modules.get(name)
            if have is not None:
                if Path(getattr(have, "__file__", "") or "").resolve() != path:
                    raise ImportError(f"a module named {show(name)} is already imported from elsewhere")
                return
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # before it runs: dataclasses look their module up
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        else:
            importlib.import_module(entry)
    except Exception as e:  # noqa: BLE001 - whatever the module raised, the caller reports one line
        raise ValueError(
            f"{POLICY_MODULES_ENV}: cannot import {show(entry)}: {type(e).__name__}: {' '.join(str(e).split())}"
        ) from None


def load_policy_modules() -> tuple:
    """Import the entries of ``$OASIS_POLICY_MODULES`` (comma-separated module names or ``.py`` paths) not imported
    yet, so that the policies they register are known to this process: a bench process, a sweep worker. Returns
    the entries; ``get_policy`` calls it before it fails on an unknown name."""
    import os

    entries = tuple(e.strip() for e in os.environ.get(POLICY_MODULES_ENV, "").split(",") if e.strip())
    for entry in entries:
        if entry not in _loaded_modules:
            _import_policy_module(entry)
            _loaded_modules.add(entry)
    return entries


def get_policy(spec: str) -> FetchCapPolicy:
    """Parse a spec: ``"fixed"`` (ratio 0.05), ``"fixed:0.1"``, ``"unlimited"``, ``"budget"``, ``"budget:0.8"``,
    ``"budget:0.8,min_cap=0,max_ratio=0.5"``, or any name added with ``register_policy``. Case and spaces ignored.

    A name not registered yet makes it import the modules of ``$OASIS_POLICY_MODULES`` (``load_policy_modules``)
    and look again: how a policy of your own reaches ``python -m oasis_exec bench``, ``oasis_sim run`` and the
    workers of ``oasis_sim sweep``, which all parse the spec with this function."""
    if not isinstance(spec, str):
        raise ValueError(f"fetch cap: expected a string such as 'fixed:0.05', got {show(spec)}")
    name, sep, arg = spec.strip().lower().partition(":")
    name, arg = name.strip(), arg.strip()
    entry = _REGISTRY.get(name)
    if entry is None:
        modules = load_policy_modules()
        entry = _REGISTRY.get(name)
    if entry is None:
        choices = ", ".join(usage for usage, _ in _REGISTRY.values())
        where = f" (after importing {POLICY_MODULES_ENV}={','.join(modules)})" if modules else ""
        raise ValueError(
            f"fetch cap {show(spec)}: unknown policy {show(name)}{where}; choices: {choices}; a policy of your own: "
            f"register_policy in a module named in {POLICY_MODULES_ENV}"
        )
    return entry[1](spec, arg if sep else None)


def canonical_specs(specs, option: str) -> list:
    """Policy specs of a command-line option checked and in their canonical spelling (``get_policy(spec).spec``,
    so that results group by policy); a bad or repeated spec is one ``ValueError`` line naming ``option``."""
    out = []
    for spec in specs or ():
        try:
            c = get_policy(spec).spec
        except ValueError as e:
            raise ValueError(f"{option}: {' '.join(str(e).split())}") from None
        if c in out:
            raise ValueError(f"{option}: {show(spec)} given twice (as {show(c)})")
        out.append(c)
    return out


# The adaptive policies shipped in their own files register themselves here, so that get_policy knows them.
from . import fetchcap_drift, fetchcap_layers, fetchcap_recall  # noqa: E402, F401
