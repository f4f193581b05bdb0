"""Sizes a run would need, checked before anything is allocated, so that an absurd but well-formed value
(``--top-k 1000000000``, ``--policy-layers 100000``) costs one line on stderr instead of an out-of-memory kill.

The dominant allocation of a run is the selection simulation (``oasis_sim.policy``): ``rows`` sampled KV-head rows
stepped together, each holding arrays over the context's blocks and over the top-K slots. ``policy_bytes``
estimates it from the configuration and the workload; ``check_footprint`` refuses a run whose estimate exceeds
``limit_bytes()`` with a ``ConfigError`` naming the fields that drive it. ``check_rates`` refuses a copy rate
faster than the hardware's link.
"""

from __future__ import annotations

import os

from oasis_core.echo import show

from .config import ConfigError, SimConfig

# Live int64/bool arrays per row and per (block or top-K slot) in one generator + plan step, measured with
# ru_maxrss on the bundled trace (9-17 x 8 bytes), rounded up.
BYTES_PER_ROW_SLOT = 8 * 20
# The most a run may plan to allocate: 8 GiB, or half of the machine's memory if that is less.
MAX_POLICY_BYTES = 8 * 2**30


def limit_bytes() -> int:
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        phys = 2 * MAX_POLICY_BYTES
    return min(MAX_POLICY_BYTES, phys // 2)


def policy_bytes(cfg: SimConfig, block_counts, concurrent: int) -> tuple[int, int, int]:
    """(estimated bytes, rows, widest block count) of the selection simulation; 0 bytes for dense runs.

    ``block_counts``: each request's blocks (as ``PolicySource`` gets them); ``concurrent``: most requests decoding
    at once (exact sampling runs one episode per running request)."""
    if not cfg.sparse or not block_counts:
        return 0, 0, 0
    from .policy import bucket_of

    width = max(max(int(n), 2) for n in block_counts)
    rows_per_group = cfg.policy_layers * cfg.model_spec.n_kv_heads
    if cfg.policy_sampling == "profile" and cfg.selection != "replay":
        groups = len({bucket_of(n) for n in block_counts}) * cfg.profile_replicas
    else:
        groups = max(1, min(concurrent, len(block_counts)))
    rows = rows_per_group * groups
    return rows * (width + cfg.resident_slots) * BYTES_PER_ROW_SLOT, rows, width


def check_footprint(cfg: SimConfig, block_counts, concurrent: int) -> None:
    need, rows, width = policy_bytes(cfg, block_counts, concurrent)
    limit = limit_bytes()
    if need > limit:
        raise ConfigError(
            f"top_k: {cfg.top_k:,} with policy_layers = {cfg.policy_layers} and contexts of up to {width:,} blocks "
            f"needs ~{need / 2**30:,.1f} GiB for the selection simulation ({rows:,} rows x {width + cfg.resident_slots:,} "
            f"slots), more than the {limit / 2**30:.1f} GiB limit; lower --top-k, --policy-layers or "
            f"--max-context, or raise --block-size"
        )


def check_rates(cfg: SimConfig) -> None:
    """Refuse a host->GPU copy rate above the hardware preset's link (``HardwareSpec.h2d_bytes_per_s``)."""
    link = cfg.hardware_spec.h2d_bytes_per_s
    if cfg.h2d_bytes_per_s is not None and cfg.h2d_bytes_per_s > link * (1 + 1e-9):
        raise ConfigError(
            f"h2d_bytes_per_s: must be <= the {cfg.hardware} link's {link:.4g} B/s, got {show(cfg.h2d_bytes_per_s)}"
        )
