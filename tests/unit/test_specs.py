import dataclasses

import pytest

from oasis_core.specs import HARDWARE, LINKS, MODELS, LinkSpec, SparsityConfig, get_hardware, get_link, get_model


def test_presets_have_the_published_shapes():
    q8 = get_model("qwen3-8b")
    assert (q8.n_layers, q8.n_q_heads, q8.n_kv_heads, q8.head_dim, q8.hidden, q8.mlp_hidden, q8.vocab) == (
        36,
        32,
        8,
        128,
        4096,
        12288,
        151936,
    )
    assert q8.gqa_group == 4 and q8.qk_norm and q8.rope_theta == 1e6
    q32 = get_model("qwen3-32b")
    assert (q32.n_layers, q32.n_q_heads, q32.n_kv_heads, q32.hidden, q32.mlp_hidden) == (64, 64, 8, 5120, 25600)
    moe = get_model("qwen3-235b-a22b")
    assert (moe.n_layers, moe.n_q_heads, moe.n_kv_heads, moe.n_experts, moe.experts_active, moe.moe_mlp_hidden) == (
        94,
        64,
        4,
        128,
        8,
        1536,
    )
    llama = get_model("llama-3.1-8b")
    assert (llama.n_layers, llama.mlp_hidden, llama.vocab, llama.rope_theta, llama.rms_eps) == (
        32,
        14336,
        128256,
        5e5,
        1e-5,
    )
    tiny = get_model("tiny")
    assert (tiny.n_layers, tiny.n_q_heads, tiny.n_kv_heads, tiny.head_dim, tiny.hidden, tiny.vocab) == (
        2,
        4,
        2,
        16,
        64,
        256,
    )


@pytest.mark.parametrize(
    "name, total, active",
    [
        ("qwen3-8b", 8.2e9, 8.2e9),  # Qwen3 model card: 8.2B
        ("qwen3-32b", 32.8e9, 32.8e9),  # 32.8B
        ("qwen3-235b-a22b", 235e9, 22e9),  # 235B total, 22B activated
        ("llama-3.1-8b", 8.03e9, 8.03e9),  # Llama 3.1 model card
    ],
)
def test_derived_parameter_counts_match_published_totals(name, total, active):
    m = get_model(name)
    assert m.params_total == pytest.approx(total, rel=0.01)
    assert m.params_active == pytest.approx(active, rel=0.01)
    assert m.weight_bytes == 2 * m.params_total
    assert m.active_weight_bytes == 2 * m.params_active


def test_exact_parameter_count_of_qwen3_8b():
    # 36 x (attention 41,943,040 + q/k norm 256 + MLP 150,994,944 + 2 norms 8,192) + 2 x 151,936 x 4,096 + 4,096
    assert get_model("qwen3-8b").params_total == 8_190_735_360


def test_kv_bytes_per_token():
    assert get_model("qwen3-8b").kv_bytes_per_token == 147_456  # 144 KiB
    assert get_model("qwen3-32b").kv_bytes_per_token == 262_144
    assert get_model("qwen3-235b-a22b").kv_bytes_per_token == 94 * 2 * 4 * 128 * 2
    assert get_model("tiny").kv_bytes_per_token == 2 * 2 * 2 * 16 * 2


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_layers": 0}, "ModelSpec.n_layers: must be >= 1, got 0"),
        ({"head_dim": True}, "ModelSpec.head_dim: must be an integer, got True (bool)"),
        ({"hidden": 64.0}, "ModelSpec.hidden: must be an integer, got 64.0 (float)"),
        ({"n_q_heads": 5}, "ModelSpec.n_q_heads: must be a multiple of n_kv_heads (2), got 5"),
        ({"rope_theta": 0.0}, "ModelSpec.rope_theta: must be > 0, got 0.0"),
        ({"rms_eps": float("nan")}, "ModelSpec.rms_eps: must be finite, got nan"),
        ({"qk_norm": 1}, "ModelSpec.qk_norm: must be a bool, got 1 (int)"),
        ({"name": ""}, "ModelSpec.name: must be a non-empty string, got ''"),
        ({"experts_active": 2}, "ModelSpec.experts_active: must be 0 for a dense model (n_experts=0), got 2"),
        (
            {"n_experts": 4, "experts_active": 5, "moe_mlp_hidden": 8},
            "ModelSpec.experts_active: must be in [1, n_experts=4] for a mixture-of-experts model, got 5",
        ),
    ],
)
def test_model_validation_names_field_and_value(change, message):
    with pytest.raises(ValueError) as e:
        dataclasses.replace(get_model("tiny"), **change)
    assert str(e.value) == message


def test_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_model("tiny").n_layers = 3


def test_hardware_presets():
    h100, h200 = get_hardware("h100-sxm"), get_hardware("h200")
    assert (h100.hbm_bytes, h100.hbm_bytes_per_s, h100.bf16_flops, h100.n_sms) == (80e9, 3.35e12, 989e12, 132)
    assert (h200.hbm_bytes, h200.hbm_bytes_per_s, h200.bf16_flops, h200.n_sms) == (141e9, 4.8e12, 989e12, 132)
    assert h100.link is LINKS["pcie-gen5-x16"] and h200.pcie_link == "pcie-gen5-x16"
    # measured on the H200 machine (DESIGN.md)
    assert (h200.h2d_bytes_per_s, h200.d2h_bytes_per_s) == (55.3e9, 55.1e9)
    assert h200.measured_hbm_copy_bytes_per_s == 3.83e12 and h200.attn_read_bytes_per_s == 4.3e12
    assert h200.host_dram_bytes == 128 * 2**30 and h200.host_dram_bytes_per_gpu == 128 * 2**30
    assert dict(h200.measured_uva_gather_bytes_per_s) == {256: 21e9, 4096: 46e9, 32768: 49e9}
    # nothing measured on an H100: fall back to the link's effective rate and the HBM datasheet figure
    assert h100.h2d_bytes_per_s == 55.3e9 and h100.attn_read_bytes_per_s == 3.35e12
    assert h100.host_dram_bytes_per_gpu == 256e9


def test_hardware_validation():
    with pytest.raises(ValueError) as e:
        dataclasses.replace(get_hardware("h200"), pcie_link="pcie-gen9")
    assert (
        str(e.value)
        == "HardwareSpec.pcie_link: must be one of ['nvlink-4', 'pcie-gen5-x16', 'roce-400g'], got 'pcie-gen9'"
    )
    with pytest.raises(ValueError) as e:
        dataclasses.replace(get_hardware("h200"), hbm_bytes=0)
    assert str(e.value) == "HardwareSpec.hbm_bytes: must be >= 1, got 0"
    with pytest.raises(ValueError) as e:
        dataclasses.replace(get_hardware("h200"), measured_uva_gather_bytes_per_s=((4096, 1e9), (256, 2e9)))
    assert str(e.value) == "HardwareSpec.measured_uva_gather_bytes_per_s: must be >= 4097, got 256"


def test_links():
    pcie, roce = get_link("pcie-gen5-x16"), get_link("roce-400g")
    assert (pcie.bytes_per_s, pcie.achieved_bytes_per_s) == (64e9, 55.3e9)
    assert (roce.bytes_per_s, roce.achieved_bytes_per_s) == (50e9, 50e9)
    assert roce.transfer_s(50e9, n_transfers=2) == pytest.approx(1.0 + 2 * roce.latency_s)
    with pytest.raises(ValueError) as e:
        LinkSpec(name="x", bytes_per_s=1e9, latency_s=0.0, effective_bytes_per_s=2e9)
    assert str(e.value) == "LinkSpec.effective_bytes_per_s: must be <= bytes_per_s (1000000000.0), got 2000000000.0"
    with pytest.raises(ValueError) as e:
        LinkSpec(name="x", bytes_per_s=1e9, latency_s=-1e-6)
    assert str(e.value) == "LinkSpec.latency_s: must be >= 0, got -1e-06"


def test_sparsity_defaults_and_validation():
    s = SparsityConfig()
    assert (s.block_size, s.top_k, s.fetch_ratio, s.local_blocks) == (16, 128, 0.05, 1)
    assert (s.resident_blocks, s.resident_tokens) == (129, 2064)
    for change, message in [
        ({"top_k": 0}, "SparsityConfig.top_k: must be >= 1, got 0"),
        ({"fetch_ratio": 1.5}, "SparsityConfig.fetch_ratio: must be in (0, 1], got 1.5"),
        ({"fetch_ratio": 0}, "SparsityConfig.fetch_ratio: must be > 0, got 0"),
        ({"local_blocks": -1}, "SparsityConfig.local_blocks: must be >= 0, got -1"),
    ]:
        with pytest.raises(ValueError) as e:
            SparsityConfig(**change)
        assert str(e.value) == message


@pytest.mark.parametrize(
    "getter, kind, table",
    [(get_model, "model", MODELS), (get_hardware, "hardware", HARDWARE), (get_link, "link", LINKS)],
)
def test_lookup_names_bad_name_and_choices(getter, kind, table):
    with pytest.raises(ValueError) as e:
        getter("nope")
    assert str(e.value) == f"unknown {kind} 'nope'; choose one of: {', '.join(sorted(table))}"
    with pytest.raises(ValueError):
        getter(["unhashable"])
    for name in table:
        assert getter(name).name == name
