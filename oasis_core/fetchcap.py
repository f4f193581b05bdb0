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

import math
import numbers
from dataclasses import dataclass
from typing import Optional

from .echo import show
from .fetchcap_base import (  # the base and the registry, re-exported: policies are written against these names
    _REGISTRY,
    DEFAULT_FETCH_RATIO,
    CapContext,
    FetchCapPolicy,
    _num,
    assign,
    parse_fields,
    ratio_cap,
    register_policy,
    spec_of,
    split_budget,
    state_array,
)
from .xp import namespace

__all__ = [  # this module's face: the shipped policies, the registry's lookups and the base they are written against
    "DEFAULT_FETCH_RATIO",
    "POLICY_MODULES_ENV",
    "CapContext",
    "FetchCapPolicy",
    "Fixed",
    "LinkBudget",
    "Unlimited",
    "assign",
    "canonical_specs",
    "get_policy",
    "load_policy_modules",
    "parse_fields",
    "policy_names",
    "ratio_cap",
    "register_policy",
    "spec_of",
    "split_budget",
    "state_array",
]


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


_BUDGET_FIELDS = {"link_fraction": float, "min_cap": int, "max_ratio": float, "first_ratio": float}


def _parse_budget(spec, arg):
    return parse_fields(spec, arg, LinkBudget, _BUDGET_FIELDS, positional="link_fraction")


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


# The adaptive policies shipped in their own files register themselves (through fetchcap_base), so get_policy knows them.
from . import fetchcap_drift, fetchcap_layers, fetchcap_recall  # noqa: E402, F401
