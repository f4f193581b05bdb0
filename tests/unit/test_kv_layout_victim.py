"""``oasis_exec.kv.layout.victim_slots``: a background mode left at ``hot_slots=None`` grows a victim cache of
3 x top_k slots a row where the requests its config names fit the GPU budget at that size, and keeps top_k
everywhere else (no budget, no request count, a budget without room, an explicit hot_slots, other modes)."""

import pytest
import torch

from oasis_core.geometry import KVGeometry
from oasis_core.specs import get_model
from oasis_exec.config import ExecConfig
from oasis_exec.kv.layout import VICTIM_FACTOR, build_kv_layout, victim_slots
from oasis_exec.kv.store import SparseStore

K, NB = 4, 20
SHAPE = get_model("tiny")
GEO = KVGeometry(SHAPE, block_size=16, dtype_bytes=4)
BIG = SparseStore.bytes_per_lane(GEO, VICTIM_FACTOR * K, NB)
SMALL = SparseStore.bytes_per_lane(GEO, K, NB)


def _cfg(**kw):
    base = dict(model="tiny", device="cpu", dtype="float32", top_k=K, block_size=16, max_context=NB * 16)
    return ExecConfig(**{**base, **kw})


def _layout(c):
    return build_kv_layout(c, shape=SHAPE, dtype=torch.float32, device=torch.device("cpu"))


@pytest.mark.parametrize("mode", ["lookahead", "proxy"])
def test_room_for_the_named_requests_grows_a_victim_cache(mode):
    c = _cfg(mode=mode, host_requests=3, kv_budget_gb=3 * BIG / 1e9)
    kv = _layout(c)
    assert c.max_blocks == NB and kv.store.S == VICTIM_FACTOR * K == victim_slots(c, GEO)
    assert kv.lane_bytes == BIG and kv.max_lanes == 3
    assert c.resident_slots == K  # the config's own answer; the built store is what runs


def test_no_room_keeps_the_working_set():
    c = _cfg(mode="lookahead", host_requests=3, kv_budget_gb=(3 * BIG - 1000) / 1e9)
    kv = _layout(c)
    assert kv.store.S == K and kv.max_lanes == int(c.kv_budget_gb * 1e9 // SMALL) > 3


@pytest.mark.parametrize(
    "kw, want",
    [
        (dict(max_lanes=2), VICTIM_FACTOR * K),  # max_lanes names the requests too
        (dict(max_lanes=2, host_requests=5), VICTIM_FACTOR * K),  # the smallest count binds
        (dict(max_lanes=5, host_requests=6), K),  # 5 lanes of 3K do not fit 4 of them
        (dict(), K),  # no count: the budget's lanes at top_k
        (dict(host_requests=2, hot_slots=K), K),  # explicit: the paper's working set
        (dict(host_requests=2, hot_slots=8), 8),
    ],
)
def test_the_named_requests_and_an_explicit_hot_slots(kw, want):
    c = _cfg(mode="lookahead", kv_budget_gb=4 * BIG / 1e9, **kw)
    assert _layout(c).store.S == want


def test_host_kv_gb_names_the_requests():
    per_request = NB * GEO.host_bytes_per_block("auto")
    fits = _cfg(mode="lookahead", kv_budget_gb=2 * BIG / 1e9, host_kv_gb=(2 * per_request + 1000) / 1e9)
    over = _cfg(mode="lookahead", kv_budget_gb=2 * BIG / 1e9, host_kv_gb=(3 * per_request + 1000) / 1e9)
    assert victim_slots(fits, GEO) == VICTIM_FACTOR * K and victim_slots(over, GEO) == K


def test_no_budget_and_other_modes_are_left_alone():
    assert victim_slots(_cfg(mode="lookahead", host_requests=1), GEO) == K
    assert victim_slots(_cfg(mode="retrieval", host_requests=1, kv_budget_gb=10 * BIG / 1e9), GEO) == K
    assert victim_slots(_cfg(mode="hisparse", host_requests=1, kv_budget_gb=10 * BIG / 1e9), GEO) == 2 * K
