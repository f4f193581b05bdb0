"""Hybrid attention in the model spec: per-layer windows, their derived bytes, and the hybrid presets."""

import dataclasses

import pytest

from oasis_core.specs import MODELS, ModelSpec, get_model, periodic_windows, tp_local


def test_gemma3_270m_has_the_published_shape_and_hybrid_layers():
    g = get_model("gemma3-270m")
    assert (g.n_layers, g.hidden, g.n_q_heads, g.n_kv_heads, g.head_dim, g.mlp_hidden) == (18, 640, 4, 1, 256, 2048)
    assert (g.vocab, g.max_context_tokens, g.tie_embeddings) == (262144, 32768, True)
    assert g.full_layers == (5, 11, 17)
    assert g.sliding_layers == tuple(l for l in range(18) if l not in (5, 11, 17))
    assert [g.layer_window(l) for l in (0, 4, 5, 6, 17)] == [512, 512, None, 512, None]
    assert (g.rope_theta, g.rope_theta_sliding) == (1e6, 1e4)
    # the figures: 3 x 2 x 256 x 2 B = 3 KB a token on the full layers; 15 windows of 512 tokens = 7.9 MB
    assert g.kv_bytes_per_token_layer == 2 * 1 * 256 * 2 == 1024
    assert g.full_kv_bytes_per_token == 3 * 1024
    assert g.window_kv_bytes == 15 * 512 * 1024 == 7_864_320
    assert g.kv_bytes(32768) == 32768 * 3072 + 7_864_320  # ~100 MB + 7.9 MB
    assert g.kv_bytes(100) == 100 * 3072 + 15 * 100 * 1024  # a window shorter than W holds the context only
    assert g.kv_bytes_per_token == 18 * 1024  # what a cache without windows would hold


def test_larger_hybrid_presets_follow_their_published_configs():
    g27 = get_model("gemma3-27b")
    assert (g27.n_layers, g27.n_q_heads, g27.n_kv_heads, g27.head_dim, g27.hidden, g27.mlp_hidden) == (
        62,
        32,
        16,
        128,
        5376,
        21504,
    )
    assert g27.full_layers == (5, 11, 17, 23, 29, 35, 41, 47, 53, 59)  # 5 local : 1 global
    assert {g27.layer_window(l) for l in g27.sliding_layers} == {1024}
    assert g27.full_kv_bytes_per_token == 10 * 2 * 16 * 128 * 2
    assert g27.window_kv_bytes == 52 * 1024 * 2 * 16 * 128 * 2
    oss = get_model("gpt-oss-120b")
    assert (oss.n_layers, oss.n_q_heads, oss.n_kv_heads, oss.head_dim, oss.hidden) == (36, 64, 8, 64, 2880)
    assert (oss.n_experts, oss.experts_active, oss.moe_mlp_hidden) == (128, 4, 2880)
    assert oss.full_layers == tuple(range(1, 36, 2)) and oss.sliding_layers == tuple(range(0, 36, 2))
    assert {oss.layer_window(l) for l in oss.sliding_layers} == {128}


@pytest.mark.parametrize(
    "name, total",
    [
        ("gemma3-270m", 268e6),  # Gemma 3 270M model card
        ("gemma3-27b", 27e9),  # Gemma 3 27B (language model)
        ("gpt-oss-120b", 116.8e9),  # GPT-OSS model card: 116.83B
    ],
)
def test_hybrid_preset_parameter_counts_match_published_totals(name, total):
    assert get_model(name).params_total == pytest.approx(total, rel=0.01)


def test_a_model_without_windows_is_all_full_and_keeps_its_bytes():
    for name in ("qwen3-8b", "llama-3.1-8b", "smollm2-135m", "tiny"):
        m = get_model(name)
        assert not m.is_hybrid and m.layer_windows == ()
        assert m.full_layers == tuple(range(m.n_layers)) and m.sliding_layers == ()
        assert m.full_kv_bytes_per_token == m.kv_bytes_per_token and m.window_kv_bytes == 0
        assert m.kv_bytes(16384) == 16384 * m.kv_bytes_per_token
        assert m.rope_theta_sliding == m.rope_theta
    # an explicit all-None tuple is the same model as the empty one, byte for byte
    q = get_model("qwen3-8b")
    explicit = dataclasses.replace(q, layer_windows=(None,) * q.n_layers)
    assert (explicit.full_layers, explicit.full_kv_bytes_per_token, explicit.window_kv_bytes) == (
        q.full_layers,
        q.full_kv_bytes_per_token,
        0,
    )


def test_periodic_windows_and_validation():
    assert periodic_windows(6, 8, period=3, full_at=2) == (8, 8, None, 8, 8, None)
    assert periodic_windows(4, 128, period=2, full_at=1) == (128, None, 128, None)
    with pytest.raises(ValueError, match=r"periodic_windows.full_at: must be in \[0, period=2\), got 2"):
        periodic_windows(4, 128, period=2, full_at=2)
    tiny = get_model("tiny")
    with pytest.raises(ValueError, match=r"ModelSpec.layer_windows: must be empty or hold one entry per layer \(2\)"):
        dataclasses.replace(tiny, layer_windows=(None,))
    with pytest.raises(ValueError, match=r"ModelSpec.layer_windows\[1\]: must be None \(full\) or an integer >= 1"):
        dataclasses.replace(tiny, layer_windows=(None, 0))
    with pytest.raises(ValueError, match=r"ModelSpec.layer_windows: must be a tuple"):
        dataclasses.replace(tiny, layer_windows=[None, 4])
    with pytest.raises(ValueError, match=r"ModelSpec.layer_window: layer must be in \[0, 2\), got 2"):
        tiny.layer_window(2)


def test_tensor_parallel_share_keeps_the_layer_kinds():
    g27 = get_model("gemma3-27b")
    half = tp_local(g27, 2, 0)
    assert half.layer_windows == g27.layer_windows and half.n_kv_heads == 8
    assert half.full_kv_bytes_per_token * 2 == g27.full_kv_bytes_per_token


def test_every_preset_is_a_valid_spec():
    for m in MODELS.values():
        assert isinstance(m, ModelSpec)
        assert len(m.full_layers) + len(m.sliding_layers) == m.n_layers


def test_mxfp4_experts_size_gpt_oss_as_published_and_leave_others_alone():
    oss = get_model("gpt-oss-120b")
    assert oss.expert_bytes_per_param == 4.25 / 8
    experts = 36 * 128 * 3 * 2880 * 2880  # every expert matrix of every layer
    assert oss.weight_bytes == round((oss.params_total - experts) * 2 + experts * 4.25 / 8)
    assert 64e9 < oss.weight_bytes < 66e9  # the checkpoint: 60.8 GiB, fits one 80 GB GPU
    active = 36 * 4 * 3 * 2880 * 2880
    assert oss.active_weight_bytes == round((oss.params_active - active) * 2 + active * 4.25 / 8)
    per_layer = oss.attn_params_per_layer + oss.active_mlp_params_per_layer
    assert oss.layer_active_weight_bytes == round(
        (per_layer - 4 * 3 * 2880 * 2880) * 2 + 4 * 3 * 2880 * 2880 * 4.25 / 8
    )
    for name in ("qwen3-8b", "qwen3-235b-a22b", "gemma3-270m"):
        m = get_model(name)
        assert m.weight_bytes == m.params_total * m.dtype_bytes
        assert m.layer_active_weight_bytes == (m.attn_params_per_layer + m.active_mlp_params_per_layer) * m.dtype_bytes
    with pytest.raises(ValueError, match=r"ModelSpec.expert_bytes_per_param: must be None for a dense model"):
        dataclasses.replace(get_model("tiny"), expert_bytes_per_param=0.5)


def test_gemma3_270m_preset_matches_the_real_model():
    """The preset against the GGUF's own metadata (``oasis_exec.model.gemma3_path()``: ``$OASIS_GEMMA3_GGUF``, or
    the file the PyPI packages assemble, as CI installs them; skipped without either) and the layer pattern against
    transformers' Gemma 3 config (the GGUF stores the window, not which layers are full: llama.cpp and transformers
    both take every sixth)."""
    from oasis_exec.model.gemma3_files import gemma3_path

    try:
        path = gemma3_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    gguf = pytest.importorskip("gguf")
    transformers = pytest.importorskip("transformers")
    fields = gguf.GGUFReader(path).fields

    def meta(key):
        f = fields[f"gemma3.{key}"]
        return f.parts[f.data[0]].tolist()[0]

    g = get_model("gemma3-270m")
    assert (meta("block_count"), meta("embedding_length"), meta("feed_forward_length")) == (18, 640, 2048)
    assert (meta("attention.head_count"), meta("attention.head_count_kv"), meta("attention.key_length")) == (4, 1, 256)
    assert (meta("context_length"), meta("attention.sliding_window"), meta("rope.freq_base")) == (32768, 512, 1e6)
    assert len(fields["tokenizer.ggml.tokens"].data) == g.vocab
    assert (g.n_layers, g.hidden, g.mlp_hidden, g.n_q_heads, g.n_kv_heads, g.head_dim) == (18, 640, 2048, 4, 1, 256)
    assert (g.max_context_tokens, g.rope_theta) == (32768, 1e6)
    assert {g.layer_window(l) for l in g.sliding_layers} == {512}
    kinds = transformers.Gemma3TextConfig(num_hidden_layers=18, sliding_window=512).layer_types
    assert g.full_layers == tuple(l for l, k in enumerate(kinds) if k == "full_attention")
