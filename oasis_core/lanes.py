"""The executor's GPU lanes and host pool, as rules both backends apply (bytes; no torch).

A *lane* is one request's slot in the GPU KV store: the executor reserves it whole at admission, so a GPU budget
holds ``budget // lane_bytes`` requests. ``oasis_exec.kv_layout`` sizes its stores with these rules and
``oasis_sim`` (``SimConfig.kv_budget_gb``) admits against them, so the simulator's lanes are the executor's:

- sparse modes: a lane holds ``slots`` blocks a (layer, KV head) row plus the local and a trash block, the
  summaries of ``max_blocks`` blocks and two int64 tables of ``slots`` entries a row (resident ids, last selection);
- dense modes: the pages of ``max_blocks`` blocks (and, quest, their summaries);
- a hybrid model (``ModelSpec.layer_windows``): the above for its full layers only, plus the rings of its windowed
  layers in either kind of lane (``KVGeometry.window_bytes``: fixed once the context reaches the windows);
- the victim cache: a background mode left at ``hot_slots=None`` holds ``VICTIM_FACTOR x top_k`` slots a row when
  the requests the run names fit the budget at that size, else ``top_k``;
- the host pool: ``host_kv_gb`` when given, else ``max_blocks`` blocks for each of ``min(lanes, host_requests)``.
"""

from __future__ import annotations

from typing import Callable, Optional

from .geometry import KVGeometry

GB = 1e9
VICTIM_FACTOR = 3  # the victim cache the H200 measured: S = 3 x top_k (results/figures_victim_vllm_4e13b06)
DEFAULT_LANES = 4  # lanes of a run with neither a budget nor max_lanes


def sparse_lane_bytes(geo: KVGeometry, slots: int, max_blocks: int) -> int:
    """GPU bytes of one sparse lane: ``slots`` + local + trash blocks in every row, the summaries of ``max_blocks``
    blocks, and the int64 resident / last_sel tables (``oasis_exec.kv_store.SparseStore``). A hybrid model's rows are
    its full layers' (``KVGeometry.rows_per_request``); its windowed layers add their rings, ``min(L, W)`` tokens a
    layer (``KVGeometry.window_bytes``, as in ``dense_lane_bytes``)."""
    kv = geo.resident_bytes(slots, local_blocks=2)
    tokens = max_blocks * geo.block_size
    summ = geo.summary_bytes(tokens)
    return kv + summ + 2 * geo.rows_per_request * slots * 8 + geo.window_bytes(tokens)


def dense_lane_bytes(geo: KVGeometry, max_blocks: int, summaries: bool) -> int:
    """GPU bytes of one dense lane: the pages of ``max_blocks`` blocks and (quest) their summaries."""
    tokens = max_blocks * geo.block_size
    return geo.m_kv(1, tokens) + (geo.summary_bytes(tokens) if summaries else 0)


def budget_lanes(budget_bytes: Optional[float], lane_bytes: int, max_lanes: Optional[int] = None) -> int:
    """Lanes a run gets: ``max_lanes`` (or, without it, what the budget holds; ``DEFAULT_LANES`` with neither), never
    more than the budget holds. May be 0: the caller says why one lane does not fit."""
    lanes = max_lanes or (int(budget_bytes // lane_bytes) if budget_bytes else DEFAULT_LANES)
    if budget_bytes:
        lanes = min(lanes, int(budget_bytes // lane_bytes))
    return lanes


def wanted_lanes(
    max_lanes: Optional[int],
    host_requests: Optional[int],
    host_kv_gb: Optional[float],
    max_blocks: int,
    host_block_bytes: int,
) -> Optional[int]:
    """The requests a run says will run at once: the smallest of ``max_lanes``, ``host_requests`` and the requests of
    ``max_blocks`` blocks that ``host_kv_gb`` holds; None when it names none of them."""
    given = [n for n in (max_lanes, host_requests) if n]
    if host_kv_gb:
        given.append(int(host_kv_gb * GB // (max_blocks * host_block_bytes)))
    return min(given) if given else None


def victim_slots(
    resident_slots: int,
    top_k: int,
    *,
    hot_slots_given: bool,
    background: bool,
    budget_gb: Optional[float],
    wanted: Optional[int],
    lane_bytes_of: Callable[[int], int],
) -> int:
    """Slots a row of a sparse mode holds: ``resident_slots``, except in a background mode left at ``hot_slots=None``
    with a GPU budget and a known number of requests (``wanted``), where ``VICTIM_FACTOR x top_k`` when that many
    lanes of that size (``lane_bytes_of(slots)``) fit the budget."""
    if hot_slots_given or not background or not budget_gb:
        return resident_slots
    big = VICTIM_FACTOR * top_k
    if wanted and wanted * lane_bytes_of(big) <= budget_gb * GB:
        return big
    return resident_slots


def host_pool_blocks(
    host_kv_gb: Optional[float], lanes: int, host_requests: Optional[int], max_blocks: int, block_bytes: int
) -> int:
    """Blocks of the host pool: ``host_kv_gb`` of ``block_bytes`` blocks, else ``max_blocks`` for each of
    ``min(lanes, host_requests)`` requests (all lanes when ``host_requests`` is not given)."""
    if host_kv_gb:
        return int(host_kv_gb * GB // block_bytes)
    return min(lanes, host_requests or lanes) * max_blocks
