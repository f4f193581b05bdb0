"""The working-set families by name (``oasis_core.modes.Mode.set_family``): a mode family is one file with a
``WorkingSet`` subclass (``workingset/base.py``) and one entry here (``docs/structures.md``, "Adding a mode
family")."""

from __future__ import annotations

from .hot_cache import HotCacheSet
from .paged import PagedSet
from .resident import ResidentSet
from .window import WindowSet

FAMILIES = {
    "paged": PagedSet,  # dense, quest
    "resident": ResidentSet,  # retrieval, proxy, lookahead (+ the victim cache)
    "hot_cache": HotCacheSet,  # hisparse
}


def build_sets(parts, mode, ring=None) -> list:
    """The working set of each layer: a hybrid model's sliding layers share one ``WindowSet`` over ``ring``; every
    other layer has the mode family's set (one object)."""
    try:
        cls = FAMILIES[mode.set_family]
    except KeyError:
        raise ValueError(
            f"mode {mode.name!r}: no working-set family {mode.set_family!r} (known: {sorted(FAMILIES)})"
        ) from None
    main = cls(parts)
    window = WindowSet(parts, ring) if ring is not None else None
    return [window if ring is not None and ring.has(l) else main for l in range(parts.L)]
