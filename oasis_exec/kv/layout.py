"""The runner's KV stores, built and sized: how many lanes the GPU budget holds and how large the host pool is.

``build_kv_layout(cfg, shape=, dtype=, device=)`` sizes one lane from ``KVGeometry`` (``SparseStore.bytes_per_lane``
in the sparse modes, with ``victim_slots`` slots a row: ``ExecConfig.resident_slots`` (``top_k``, or ``hot_slots``),
or in a background mode left at ``hot_slots=None`` a victim cache of 3 x top_k where the requests it will run leave
the budget room;
``DenseStore.bytes_per_lane`` in the dense ones), takes the lanes the budget holds
(``kv_budget_gb``; at most ``max_lanes`` when given, 4 when neither is), sizes the host pool through
``oasis_exec.kv.host_memory.host_pool_blocks`` (checked against the host's memory before a byte is pinned; its block
bytes are the host copy's, ``KVGeometry.host_bytes_per_block(cfg.host_kv_dtype)``: half of bf16's, plus the scales,
with an fp8 host copy) and builds the stores of ``kv_store.py``. A hybrid model's lane is its full layers' share
(slots or pages, summaries, tables; the host pool holds the full layers only) plus its rings: ``RingKV.bytes_per_lane``
with ``ring_extra`` slots past each window, whatever the context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasis_core import lanes
from oasis_core.geometry import KVGeometry
from oasis_core.token_scorer import geometry_rank

from .host_memory import host_pool_blocks
from .ring import RingKV, ring_extra
from .store import DenseStore, HostPool, SparseStore
from .token_summaries import TokenSummaries


@dataclass(frozen=True, kw_only=True)
class KVLayout:
    """The stores of one runner: ``store`` on the GPU, ``host`` (sparse modes; else None) with
    ``host_blocks_total`` blocks, for ``max_lanes`` lanes of ``lane_bytes`` each."""

    geometry: KVGeometry
    lane_bytes: int
    max_lanes: int
    store: SparseStore | DenseStore
    host: HostPool | None
    host_blocks_total: int


VICTIM_FACTOR = lanes.VICTIM_FACTOR  # the rules are oasis_core.lanes' (the simulator's too)


def wanted_lanes(cfg, geo: KVGeometry) -> int | None:
    """The requests ``cfg`` says will run at once: the smallest of ``max_lanes``, ``host_requests`` and the requests
    of ``max_context`` tokens that ``host_kv_gb`` holds; None when it says none of them (then the budget's lanes)."""
    hb = geo.host_bytes_per_block(cfg.host_kv_dtype)
    return lanes.wanted_lanes(cfg.max_lanes, cfg.host_requests, cfg.host_kv_gb, cfg.max_blocks, hb)


def victim_slots(cfg, geo: KVGeometry) -> int:
    """Slots a row of a sparse mode: ``cfg.resident_slots``, except in a background mode left at ``hot_slots=None``
    with a GPU budget and a known number of requests (``wanted_lanes``): there a victim cache of
    ``VICTIM_FACTOR * top_k`` slots when those lanes fit the budget at that size. The spare budget that the lanes
    bound by host memory leave then keeps the blocks the prediction dropped: at 16K x 44 on the H200 the copies fell
    from 622.9 to 44.9 MB a step and the token from 15.05 to 13.03 ms (32K x 22: 12.25 to 12.08;
    ``experiments/dense_vs_lookahead_throughput/results/figures_victim_vllm_4e13b06``). ``hot_slots=top_k`` keeps
    the paper's working set."""
    return lanes.victim_slots(
        cfg.resident_slots,
        cfg.top_k,
        hot_slots_given=cfg.hot_slots is not None,
        background=cfg.mode_spec.background,  # hisparse: not background
        budget_gb=cfg.kv_budget_gb,
        wanted=wanted_lanes(cfg, geo),
        lane_bytes_of=lambda s: SparseStore.bytes_per_lane(geo, s, cfg.max_blocks),
    )


def build_kv_layout(cfg, *, shape, dtype, device) -> KVLayout:
    """The stores for ``cfg`` (an ``ExecConfig``) and the model ``shape``; ValueError when one lane exceeds the
    budget, ``HostMemoryError`` when the host cannot hold the pool."""
    mode = cfg.mode_spec
    s = shape
    bs, H, D, L = cfg.block_size, s.n_kv_heads, s.head_dim, s.n_layers
    NB = cfg.max_blocks
    rank = geometry_rank(cfg.block_score, D, cfg.token_rank)  # the per-token scorer's bytes, else min/max's
    geo = KVGeometry(s, block_size=bs, dtype_bytes=torch.tensor([], dtype=dtype).element_size(), token_rank=rank)
    if cfg.sparse:
        S = victim_slots(cfg, geo)  # what each row holds on the GPU: top_k, hisparse's hot cache or a victim cache
        per_lane = SparseStore.bytes_per_lane(geo, S, NB)
    else:
        per_lane = DenseStore.bytes_per_lane(geo, NB, mode.summaries)
    if s.is_hybrid:  # the lane rules count min(L, W) tokens a window; the rings hold W + ring_extra slots
        per_lane += RingKV.bytes_per_lane(s, ring_extra(cfg), geo.dtype_bytes) - geo.window_bytes(NB * bs)
    budget = cfg.kv_budget_gb * 1e9 if cfg.kv_budget_gb else None
    n_lanes = lanes.budget_lanes(budget, per_lane, cfg.max_lanes)
    if n_lanes < 1:
        raise ValueError(f"kv_budget_gb={cfg.kv_budget_gb}: one request needs {per_lane / 1e9:.2f} GB")
    host = None
    host_blocks = 0
    if cfg.sparse:
        # sized for what runs, checked before pinning; an fp8 host copy counts 1 byte an element plus its scales
        hb = host_pool_blocks(cfg, lanes=n_lanes, block_bytes=geo.host_bytes_per_block(cfg.host_kv_dtype))
        quantized = cfg.host_kv_dtype == "fp8_e4m3"
        host = HostPool(L, hb, H, bs, D, dtype, pin=device.type == "cuda", quantized=quantized, layers=s.full_layers)
        host_blocks = hb
        tok = TokenSummaries(L, s.full_layers, n_lanes, H, NB, bs, D, cfg, dtype, device) if rank else None
        store = SparseStore(L, n_lanes, H, S, bs, D, NB, dtype, device, layers=s.full_layers, tok=tok)
    else:
        tok = (
            TokenSummaries(L, s.full_layers, n_lanes, H, NB, bs, D, cfg, dtype, device)
            if rank and mode.summaries
            else None
        )
        store = DenseStore(
            L, n_lanes, H, NB, D, bs, dtype, device, summaries=mode.summaries, paged_layers=s.full_layers, tok=tok
        )
    return KVLayout(
        geometry=geo, lane_bytes=per_lane, max_lanes=n_lanes, store=store, host=host, host_blocks_total=host_blocks
    )
