import pytest

from oasis_core.geometry import KVGeometry, c_token
from oasis_core.specs import get_hardware, get_link, get_model


@pytest.fixture
def q8():
    return KVGeometry(get_model("qwen3-8b"))


def test_qwen3_8b_bytes_per_token_is_144_kib(q8):
    assert q8.bytes_per_token == 144 * 1024
    assert q8.bytes_per_token_layer == 4096
    assert q8.bytes_per_token == get_model("qwen3-8b").kv_bytes_per_token


def test_block_sizes(q8):
    assert q8.bytes_per_block == 16 * 147_456
    assert q8.bytes_per_block_head == 8192  # K+V, 16 tokens x 128 x 2 B x 2
    assert q8.bytes_per_block_head_half == 4096  # the 4 KiB blocks DESIGN.md's gather figures move
    assert q8.rows_per_request == 36 * 8
    assert q8.bytes_per_block == q8.bytes_per_block_head * q8.rows_per_request


def test_n_blocks_rounds_up(q8):
    assert [q8.n_blocks(L) for L in (0, 1, 16, 17, 16384)] == [0, 1, 1, 2, 1024]


def test_paper_eq1_qwen3_8b_16k_request(q8):
    # The paper's "16K-token request holds 2.36 GB" is 16,000 tokens at 144 KiB each.
    assert q8.m_kv(1, 16_000) == 2_359_296_000
    assert q8.m_kv(1, 16_000) / 1e9 == pytest.approx(2.36, abs=0.005)
    assert q8.m_kv(32, 16_000) == 32 * q8.m_kv(1, 16_000)


def test_paper_qwen3_32b_32k_request_and_80_gb():
    g = KVGeometry(get_model("qwen3-32b"))
    assert g.m_kv(1, 32_700) == 8_572_108_800  # ~8.6 GB
    assert g.m_kv(1, 32_700) / 1e9 == pytest.approx(8.6, abs=0.05)
    assert g.b_max(80e9, 32_700) == 9
    assert g.b_max(get_hardware("h100-sxm").hbm_bytes, 32_700) == 9
    assert g.b_max(8_572_108_800 * 3, 32_700) == 3  # exact fit counts
    assert g.b_max(8_572_108_800 * 3 - 1, 32_700) == 2


def test_resident_set_of_one_request(q8):
    # 129 blocks x 36 layers x 8 KV heads x 8 KiB
    assert q8.resident_bytes(128, 1) == 129 * 288 * 8192 == 304_349_184
    assert q8.resident_bytes(128, 0) == 128 * 288 * 8192
    assert q8.resident_bytes(128) == q8.resident_bytes(128, 1)


def test_summary_is_one_sixteenth_of_block_bytes(q8):
    assert q8.summary_bytes_per_block_head * 16 == q8.bytes_per_block_head
    assert q8.summary_bytes(16_384) * 16 == q8.m_kv(1, 16_384)
    assert q8.summary_bytes(17) == 2 * 288 * 512  # two blocks, partly filled last one
    g32 = KVGeometry(get_model("qwen3-8b"), block_size=32)
    assert g32.summary_bytes(16_384) * 32 == g32.m_kv(1, 16_384)


def test_dtype_bytes_is_the_kv_cache_element_size():
    fp8 = KVGeometry(get_model("qwen3-8b"), dtype_bytes=1)
    assert fp8.bytes_per_token == 72 * 1024


def test_paper_eq3_c_token():
    link, step = get_link("pcie-gen5-x16").bytes_per_s, 0.017
    assert link * step == pytest.approx(1.088e9)
    # The paper's ~118 tokens per request: a batch of 64, a token counted as 144 kB (144 KiB read as 144,000 B).
    assert c_token(link, step, 64 * 144_000) == pytest.approx(118.06, abs=0.01)
    # With the exact 147,456 B the same batch gets 115.3 tokens each; the whole batch 7,378 tokens.
    assert c_token(link, step, 64 * 147_456) == pytest.approx(115.3, abs=0.05)
    assert c_token(link, step, 147_456) == pytest.approx(7378.5, abs=0.1)
    assert c_token(link, 0.0, 147_456) == 0.0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda g: g.m_kv(-1, 10), "KVGeometry.m_kv.B: must be >= 0, got -1"),
        (lambda g: g.b_max(80e9, 0), "KVGeometry.b_max.L: must be >= 1, got 0"),
        (lambda g: g.n_blocks(1.5), "KVGeometry.n_blocks.L: must be an integer, got 1.5 (float)"),
        (lambda g: KVGeometry(g.model, block_size=0), "KVGeometry.block_size: must be >= 1, got 0"),
        (lambda g: c_token(64e9, 0.017, 0), "c_token.bytes_per_token: must be > 0, got 0"),
    ],
)
def test_geometry_rejects_bad_arguments(q8, call, message):
    with pytest.raises(ValueError) as e:
        call(q8)
    assert str(e.value) == message
