"""A hybrid model's executor memory (issue 36): the sliding-window layers keep a ring and nothing else, so the
slots or pages, block summaries, working-set tables, host copy, prefill scratch and copy lists are allocated for the
full layers only, and a lane's bytes (what the GPU budget divides) are those of the full layers plus the rings.

Checked on the tiny Gemma-shaped model (layers 0 and 2 sliding, 1 and 3 full) against its all-full twin (the same
shape, no windows): every per-layer allocation of the hybrid is ``n_full`` times the twin's per-layer size, and the
bytes the stores and rings allocate are exactly ``max_lanes x lane_bytes``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gemma_cases import ARCH, TINY_GEMMA, WINDOW, cfg

from oasis_core import lanes as lane_rules
from oasis_core.geometry import KVGeometry
from oasis_exec.kv.layer_table import FullLayers
from oasis_exec.kv.ring import ring_extra
from oasis_exec.model.gemma3 import Gemma3Decoder, random_weights
from oasis_exec.runner.runner import Runner

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FULL = (1, 3)  # TINY_GEMMA's full layers
TWIN = replace(TINY_GEMMA, name="tiny-gemma3-all-full", layer_windows=(None,) * 4)


def runner(spec, mode, **kw):
    dec = Gemma3Decoder(spec, ARCH, random_weights(spec, 0, torch.float32), torch.float32)
    return Runner(cfg(mode, top_k=10, **kw), decoder=dec)


def nbytes(t) -> int:
    return t.numel() * t.element_size()


def per_layer_tables(st) -> dict:
    """Bytes of each per-layer table the store has (summaries; a sparse store's resident / last_sel)."""
    names = [n for n in ("kmin", "kmax", "resident", "last_sel") if getattr(st, n, None) is not None]
    return {n: getattr(st, n).nbytes for n in names}


@pytest.mark.parametrize("mode", ["lookahead", "quest", "hisparse", "dense"])
def test_sliding_layers_hold_no_tables_slots_or_host_copy(mode):
    hyb, twin = runner(TINY_GEMMA, mode), runner(TWIN, mode)
    assert hyb.max_lanes == twin.max_lanes == 3 and TINY_GEMMA.full_layers == FULL
    L, n_full = TINY_GEMMA.n_layers, len(FULL)
    got, per = per_layer_tables(hyb.store), per_layer_tables(twin.store)
    assert got.keys() == per.keys() and (got or mode == "dense")
    for name, b in got.items():  # the twin holds every layer: its per-layer size is bytes / L
        assert b == n_full * per[name] // L, name
        t = getattr(hyb.store, name)
        assert isinstance(t, FullLayers) and t.held == FULL and t.shape[0] == n_full
        assert torch.equal(t[3], t.data[1])  # indexed by the model's layer
        with pytest.raises(IndexError, match="sliding-window layer"):
            t[2]
    for l in range(L):  # slots / pages: the full layers only, each the twin's size
        want = nbytes(twin.store.k[l]) if l in FULL else 0
        assert nbytes(hyb.store.k[l]) == nbytes(hyb.store.v[l]) == want
    if hyb.host is not None:
        assert hyb.host.nbytes == n_full * twin.host.nbytes // L
        assert hyb.host.n_blocks == twin.host.n_blocks
    if hyb.pipe is not None and hyb.cfg.mode_spec.background:  # the copy lists of the layers that plan
        assert [x is not None for x in hyb.pipe.bufs.lists] == [l in FULL for l in range(L)]


@pytest.mark.parametrize(
    "mode,kw",
    [
        ("lookahead", {}),
        ("retrieval", {}),
        ("hisparse", {}),
        ("quest", {}),
        ("dense", {}),
        ("dense", {"speculative_k": 3}),
    ],
)
def test_lane_bytes_are_what_the_stores_and_rings_allocate(mode, kw):
    """``lane_bytes`` (what ``kv_budget_gb`` is divided by) equals the bytes the GPU stores and the rings hold, per
    lane: the full layers' slots or pages, summaries and tables, and the rings of W + ``ring_extra`` slots."""
    r = runner(TINY_GEMMA, mode, **kw)
    st, ring = r.store, r.model.ring
    held = sum(nbytes(t) for t in st.k + st.v) + sum(per_layer_tables(st).values())
    rings = sum(nbytes(t) for t in list(ring.k.values()) + list(ring.v.values()))
    assert rings == r.max_lanes * 2 * 2 * 2 * 32 * 4 * (WINDOW + ring_extra(r.cfg))  # 2 layers, K and V, 2 heads
    assert held + rings == r.max_lanes * r.kv.lane_bytes


def test_a_budget_holds_the_lanes_of_the_full_layers_plus_rings():
    """A GPU budget of exactly N lanes admits N: the lane is the full layers' share plus the rings (the twin's lane,
    every layer full, is larger and fits fewer)."""
    per = runner(TINY_GEMMA, "lookahead").kv.lane_bytes
    for budget, want in ((5 * per + 0.5, 5), (5 * per - 0.5, 4)):
        r = runner(TINY_GEMMA, "lookahead", kv_budget_gb=budget / 1e9, max_lanes=None)
        assert r.max_lanes == want
    geo = KVGeometry(TINY_GEMMA, block_size=16, dtype_bytes=4)
    nb = r.cfg.max_blocks
    rules = lane_rules.sparse_lane_bytes(geo, 10, nb)  # the rule both backends apply: windows at min(L, W)
    assert rules - geo.window_bytes(nb * 16) == lane_rules.sparse_lane_bytes(KVGeometry(TWIN, 16, 4), 10, nb) // 2
    assert runner(TWIN, "lookahead").kv.lane_bytes > per


@pytest.mark.parametrize("selection", ["synthetic", "model"])
def test_a_hybrid_lane_fetches_into_the_full_layers_tables(selection):
    """Few resident blocks (K = 3), so the full layers fetch every step: the compact tables take the synthetic
    sets' full-layer rows (the sets are drawn for every layer) and the model's own selections alike."""
    from gemma_cases import prompts

    from oasis_exec.engine.engine import Engine
    from oasis_exec.engine.scheduler import SamplingParams

    dec = Gemma3Decoder(TINY_GEMMA, ARCH, random_weights(TINY_GEMMA, 0, torch.float32), torch.float32)
    c = cfg("lookahead", top_k=3, fetch_ratio=0.67, selection=selection)
    eng = Engine(c, Runner(c, decoder=dec))
    out = eng.generate(prompts(lens=(90, 120)), SamplingParams(max_tokens=24))
    assert [len(o) for o in out] == [24, 24]
    st = eng.runner.store
    assert int(eng.runner.pipe.counts[1]) > 0  # units fetched
    for l in FULL:  # each full row holds 3 valid, distinct blocks of its context
        rows = st.resident[l][: 2 * TINY_GEMMA.n_kv_heads]
        assert ((rows >= 0).sum(1) == 3).all()
