"""llama.cpp's tensor names -> Hugging Face names (oasis_exec.model.gguf_tensors): one table for every architecture,
Gemma 3's four norms a layer and its tied head the only differences."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from oasis_exec.model import gguf, gguf_tensors  # noqa: E402
from oasis_exec.model.gguf_tensors import NAMES, hf_name  # noqa: E402


def test_every_reader_architecture_has_a_table():
    assert set(NAMES) == set(gguf.ARCHS)


def test_llama_and_qwen3_share_one_table():
    assert NAMES["llama"] == NAMES["qwen3"]


def test_gemma3_differs_from_llama_in_the_norms_and_the_head_only():
    (g_layer, g_top), (l_layer, l_top) = NAMES["gemma3"], NAMES["llama"]
    same = {k for k in g_layer.keys() & l_layer.keys() if g_layer[k] == l_layer[k]}
    assert set(g_layer) - same == {"post_attention_norm", "ffn_norm", "post_ffw_norm"}
    assert set(l_layer) - same == {"ffn_norm"}
    assert l_layer["ffn_norm"] == "post_attention_layernorm" == g_layer["post_attention_norm"]
    assert g_layer["ffn_norm"] == "pre_feedforward_layernorm"
    assert set(l_top) - set(g_top) == {"output.weight"} and set(g_top) < set(l_top)


@pytest.mark.parametrize(
    "name, arch, want",
    [
        ("blk.3.attn_q.weight", "llama", "model.layers.3.self_attn.q_proj.weight"),
        ("blk.0.attn_k_norm.weight", "qwen3", "model.layers.0.self_attn.k_norm.weight"),
        ("blk.11.ffn_norm.weight", "llama", "model.layers.11.post_attention_layernorm.weight"),
        ("blk.11.ffn_norm.weight", "gemma3", "model.layers.11.pre_feedforward_layernorm.weight"),
        ("blk.2.post_ffw_norm.weight", "gemma3", "model.layers.2.post_feedforward_layernorm.weight"),
        ("blk.2.post_ffw_norm.weight", "llama", None),
        ("blk.5.ffn_down.bias", "qwen3", "model.layers.5.mlp.down_proj.bias"),
        ("output.weight", "llama", "lm_head.weight"),
        ("output.weight", "gemma3", None),
        ("token_embd.weight", "gemma3", "model.embed_tokens.weight"),
        ("rope_freqs.weight", "llama", None),
        ("blk.1.attn_q", "llama", None),
    ],
)
def test_hf_name(name, arch, want):
    assert hf_name(name, arch) == want


def test_the_reader_reexports_the_one_function():
    assert gguf.hf_name is gguf_tensors.hf_name
