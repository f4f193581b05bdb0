"""How large the host KV pool is, and whether the host can hold it, decided before a byte of it is pinned.

The pool holds the full KV cache of every admitted request (sparse modes). ``host_pool_blocks`` sizes it from the
config: ``host_kv_gb`` when given, else ``max_blocks`` blocks for each of ``host_requests`` requests (at most the
lanes; all of them by default); the bench passes its concurrency as ``host_requests``, so the pool holds what runs,
not every lane the GPU budget allows (which at a 52 GB budget is several times the host's memory). It then checks
the pool against the memory the host has available (``psutil`` when installed, else ``MemAvailable`` of
``/proc/meminfo``): page-locked memory cannot be swapped, and a pool larger than what is free gets the process
killed by the kernel's OOM killer instead of an error.
"""

from __future__ import annotations

GB = 1e9
POOL_SHARE = 0.9  # of the available host memory, the most the pool may take (the rest: weights, runtime, staging)
MEMINFO = "/proc/meminfo"


class HostMemoryError(ValueError):
    """The host pool would not fit in the host's available memory; the message names both sizes."""


def available_bytes() -> int | None:
    """Host memory available to a new allocation without swapping, in bytes; None where it cannot be told."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        with open(MEMINFO) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _pinned_held() -> int:
    """Bytes of page-locked pieces this process keeps from an earlier pool (``kv_store.pinned_pieces`` frees or
    reuses them before pinning the next one, so they count as available)."""
    from . import store as kv_store

    return sum(t.numel() for t in kv_store._PINNED["pieces"])


def _gb(nbytes: float) -> str:
    v = nbytes / GB
    return f"{v:.1f}" if v >= 0.1 else f"{v:.2g}"


def check_fits(nbytes: int, available: int | None = None) -> None:
    """Raise ``HostMemoryError`` if a host pool of ``nbytes`` exceeds ``POOL_SHARE`` of the available host memory
    (``available``, else ``available_bytes()`` plus the pinned memory this process already holds). Unknown
    availability: no check."""
    if available is None:
        free = available_bytes()
        if free is None:
            return
        available = free + _pinned_held()
    if nbytes > POOL_SHARE * available:
        raise HostMemoryError(
            f"host KV pool: needs {_gb(nbytes)} GB of host memory, {_gb(available)} GB available (the pool "
            f"may take {POOL_SHARE:.0%} of it); run fewer requests or shorter contexts, or size the pool with "
            f"--host-kv-gb / --host-requests"
        )


def host_pool_blocks(cfg, *, lanes: int, block_bytes: int, available: int | None = None) -> int:
    """Blocks of the host pool for ``cfg`` (an ``ExecConfig``) with ``lanes`` GPU lanes and ``block_bytes`` per
    block (every layer and KV head, K and V, as the host copy holds them: ``KVGeometry.host_bytes_per_block``, one
    byte an element plus the scales with ``host_kv_dtype="fp8_e4m3"``), checked against the host's memory
    (``check_fits``)."""
    from oasis_core.lanes import host_pool_blocks as rule  # the simulator's rule too

    blocks = rule(cfg.host_kv_gb, lanes, cfg.host_requests, cfg.max_blocks, block_bytes)
    check_fits(blocks * block_bytes, available)
    return blocks
