"""The lane rules (``oasis_core.lanes``, both backends) for a hybrid model, by hand for Gemma 3 270M (3 full layers
of 1 KV head x 256 dims, 15 windows of 512 tokens, bf16): a lane counts the full layers' growing share and the
windows' fixed rings, in the sparse modes as in the dense ones."""

from oasis_core import lanes, specs
from oasis_core.geometry import KVGeometry

GEO = KVGeometry(specs.get_model("gemma3-270m"), block_size=16, dtype_bytes=2)
ROWS = 3  # full layers x KV heads
BLOCK_HEAD = 2 * 16 * 256 * 2  # K and V of one (block, head): 16,384 B
SUMMARY = 2 * 256 * 2  # min and max keys of one (block, head)
WINDOWS = 15 * 512 * 2 * 256 * 2  # 7,864,320 B


def test_sparse_lane_by_hand_counts_the_rings():
    nb = 2048  # 32K tokens
    want = (128 + 2) * ROWS * BLOCK_HEAD + nb * ROWS * SUMMARY + 2 * ROWS * 128 * 8 + WINDOWS
    assert lanes.sparse_lane_bytes(GEO, 128, nb) == want
    short = 20  # 320 tokens: each window holds them all
    assert lanes.sparse_lane_bytes(GEO, 8, short) == (
        10 * ROWS * BLOCK_HEAD + short * ROWS * SUMMARY + 2 * ROWS * 8 * 8 + 15 * 320 * 1024
    )


def test_dense_lane_by_hand_and_the_budget():
    nb = 2048
    per = lanes.dense_lane_bytes(GEO, nb, summaries=False)
    assert per == 32768 * 3 * 1024 + WINDOWS  # 100.7 MB + 7.9 MB
    assert lanes.budget_lanes(3e9, per) == 27  # an all-full model of Gemma's shape: 3e9 // (32768 * 18 KB) = 4
    assert lanes.dense_lane_bytes(GEO, nb, summaries=True) == per + nb * ROWS * SUMMARY
