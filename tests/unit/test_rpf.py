"""RPF: hand-off union, hand-off bytes, and the per-request ledger's at-most-once / only-selected invariants."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oasis_core.rpf import RemoteLedger, RPFError, handoff_blocks, handoff_bytes

UNIT = 8192  # Qwen3-8B: 16 tokens x K,V x 128 x bf16


def test_handoff_blocks_union_over_heads():
    assert handoff_blocks(np.array([[3, 1, -1], [1, 5, 2]])).tolist() == [1, 2, 3, 5]
    per_layer = handoff_blocks(np.array([[[3, 1], [1, -1]], [[-1, -1], [7, 0]]]))
    assert [u.tolist() for u in per_layer] == [[1, 3], [0, 7]]


def test_handoff_bytes_qwen3_8b_24k_per_head():
    # 24K tokens = 1536 blocks, 36 layers x 8 KV heads, each head's own top-128 (granularity "head").
    hb = handoff_bytes(
        36 * 8 * 128,
        n_blocks=1536,
        layers=36,
        kv_heads=8,
        kv_bytes_per_block_head=UNIT,
        summary_bytes_per_block_head=512,
        draft_state_bytes=0,
    )
    assert hb.blocks == 36 * 8 * 128 * 8192 == 301_989_888
    assert hb.local == 288 * 8192
    assert hb.summaries == 1536 * 288 * 512 == 226_492_416
    assert hb.full_kv == 1536 * 288 * 8192 == 3_623_878_656  # 3.375 GiB, the paper's 3.37
    assert hb.total == 301_989_888 + 2_359_296 + 226_492_416
    assert hb.reduction == pytest.approx(3_623_878_656 / 530_841_600)


def test_handoff_bytes_rejects_bad_input():
    with pytest.raises(ValueError, match="handoff_bytes.units"):
        handoff_bytes(-1, n_blocks=4, layers=1, kv_heads=1, kv_bytes_per_block_head=1, summary_bytes_per_block_head=1)
    with pytest.raises(ValueError, match="at most"):
        handoff_bytes(5, n_blocks=4, layers=1, kv_heads=1, kv_bytes_per_block_head=1, summary_bytes_per_block_head=1)


def _ledger_after_handoff(granularity="block"):
    led = RemoteLedger(layers=1, kv_heads=2, n_blocks=10, kv_bytes_per_block_head=UNIT)
    units = led.handoff(np.array([[[1, 2], [2, 3]]]), granularity=granularity)
    return led, units


def test_handoff_block_granularity_sends_union_for_every_head():
    led, units = _ledger_after_handoff("block")
    assert units == 6  # {1, 2, 3} for both heads
    assert led.handoff_units == 8  # plus the local block 9 of each head
    assert np.argwhere(led.sent).tolist() == [
        [0, 0, 1],
        [0, 0, 2],
        [0, 0, 3],
        [0, 0, 9],
        [0, 1, 1],
        [0, 1, 2],
        [0, 1, 3],
        [0, 1, 9],
    ]
    assert led.handoff_kv_bytes == 8 * UNIT
    with pytest.raises(RPFError, match="hand-off already done"):
        led.handoff(np.array([[[1, 2], [2, 3]]]))


def test_handoff_head_granularity_sends_own_blocks():
    led, units = _ledger_after_handoff("head")
    assert units == 4
    assert np.argwhere(led.sent[0, 0]).ravel().tolist() == [1, 2, 9]
    assert np.argwhere(led.sent[0, 1]).ravel().tolist() == [2, 3, 9]


def test_request_fetches_misses_under_cap_and_defers_the_rest():
    led, _ = _ledger_after_handoff("block")
    needed = np.array([[[1, 4, 5, -1], [6, 2, 12, 7]]])  # 12 >= n_blocks: decoded locally, never fetched
    f = led.request(needed, cap=1)
    assert f.blocks.tolist() == [[[4], [6]]]
    assert f.n_fetch.tolist() == [[1, 1]] and f.n_missing.tolist() == [[2, 2]]
    assert f.bytes == 2 * UNIT
    f = led.request(needed)
    assert f.blocks.tolist() == [[[5, -1, -1, -1], [7, -1, -1, -1]]]
    assert f.n_missing.tolist() == [[1, 1]]
    f = led.request(needed, cap=np.array([[3, 0]]))
    assert f.n_fetch.tolist() == [[0, 0]] and f.n_missing.tolist() == [[0, 0]] and f.bytes == 0
    assert led.decode_units == 4 and led.kv_bytes == (8 + 4) * UNIT
    led.check()


def test_record_raises_on_second_crossing_and_on_unselected_unit():
    led, _ = _ledger_after_handoff("block")
    again = np.zeros_like(led.sent)
    again[0, 1, 3] = True
    with pytest.raises(RPFError, match=r"\(layer 0, head 1, block 3\) would cross the network a second time"):
        led.record(again)
    never = np.zeros_like(led.sent)
    never[0, 0, 7] = True
    with pytest.raises(RPFError, match=r"\(layer 0, head 0, block 7\) was never selected"):
        led.record(never)


def test_request_rejects_duplicates_and_bad_shapes():
    led, _ = _ledger_after_handoff()
    with pytest.raises(ValueError, match="distinct"):
        led.request(np.array([[[4, 4], [1, 2]]]))
    with pytest.raises(ValueError, match=r"\[1, 2, K\]"):
        led.request(np.array([[4, 5]]))


@st.composite
def _episodes(draw):
    layers = draw(st.integers(1, 3))
    heads = draw(st.integers(1, 3))
    n_blocks = draw(st.integers(2, 24))
    k = draw(st.integers(1, n_blocks))
    seed = draw(st.integers(0, 2**31))
    steps = draw(st.integers(1, 8))
    granularity = draw(st.sampled_from(["block", "head"]))
    caps = draw(st.lists(st.one_of(st.none(), st.integers(0, k)), min_size=steps, max_size=steps))
    return layers, heads, n_blocks, k, seed, granularity, caps


def _random_sets(rng, layers, heads, k, n_ids):
    ids = np.argsort(rng.random((layers, heads, n_ids)), axis=-1)[:, :, :k]
    return np.where(rng.random((layers, heads, k)) < 0.2, -1, ids)


@settings(max_examples=60, deadline=None)
@given(_episodes())
def test_ledger_invariants_on_random_episodes(ep):
    layers, heads, n_blocks, k, seed, granularity, caps = ep
    rng = np.random.default_rng(seed)
    led = RemoteLedger(layers, heads, n_blocks, UNIT)
    pred = _random_sets(rng, layers, heads, min(k, n_blocks - 1) or 1, n_blocks - 1)
    units = led.handoff(pred, granularity=granularity)

    sent = set()  # (layer, head, block) units the test saw cross the network
    union = handoff_blocks(pred)
    for l in range(layers):
        for h in range(heads):
            own = set(pred[l, h][pred[l, h] >= 0].tolist())
            for b in union[l].tolist() if granularity == "block" else own:
                sent.add((l, h, b))
    assert units == len(sent)
    for l in range(layers):
        for h in range(heads):
            sent.add((l, h, n_blocks - 1))
    hb = handoff_bytes(
        units,
        n_blocks=n_blocks,
        layers=layers,
        kv_heads=heads,
        kv_bytes_per_block_head=UNIT,
        summary_bytes_per_block_head=512,
    )
    assert led.handoff_kv_bytes == hb.blocks + hb.local == len(sent) * UNIT

    step_bytes = 0
    for cap in caps:
        needed = _random_sets(rng, layers, heads, k, n_blocks + 3)  # ids >= n_blocks are local decode blocks
        f = led.request(needed, cap=cap)
        step_bytes += f.bytes
        for l in range(layers):
            for h in range(heads):
                row = [b for b in needed[l, h].tolist() if 0 <= b < n_blocks]
                misses = [b for b in row if (l, h, b) not in sent]
                got = [b for b in f.blocks[l, h].tolist() if b >= 0]
                expect = misses if cap is None else misses[:cap]
                assert got == expect  # misses in the given order, cut at the cap
                assert f.n_missing[l, h] == len(misses) and f.n_fetch[l, h] == len(got)
                for b in got:
                    assert (l, h, b) not in sent  # never twice
                    assert b in row  # only a selected unit
                    sent.add((l, h, b))
    assert led.kv_bytes == len(sent) * UNIT == led.handoff_kv_bytes + step_bytes
    assert np.argwhere(led.sent).tolist() == sorted([list(u) for u in sent])
    led.check()
