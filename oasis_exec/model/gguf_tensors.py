"""A GGUF's tensors under the Hugging Face names the decoders load: llama.cpp's names per architecture, one table.

Below both GGUF readers (``gguf`` for Llama / Qwen3, ``gemma3_files`` for Gemma 3), which import it and not each
other. Every family shares the projections, the MLP, the q/k norms and the input norm; they differ in the other
norms (Gemma 3 has four a layer) and in whether the file may carry an untied LM head (``output.weight``).
"""

from __future__ import annotations

import numpy as np

from .files import GGUFError

_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
_DENSE_LAYER = {"ffn_norm": "post_attention_layernorm"}
_DENSE_TOP = {"output.weight": "lm_head.weight"}
_GEMMA3_LAYER = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}

# architecture -> (per-layer names ``blk.{i}.<key>.<weight|bias>``, whole-model names)
NAMES = {
    "llama": ({**_LAYER, **_DENSE_LAYER}, {**_TOP, **_DENSE_TOP}),
    "qwen3": ({**_LAYER, **_DENSE_LAYER}, {**_TOP, **_DENSE_TOP}),
    "gemma3": ({**_LAYER, **_GEMMA3_LAYER}, dict(_TOP)),
}


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of GGUF tensor ``gguf_name`` in an ``arch`` file; None for a name it does not have."""
    layer, top = NAMES[arch]
    if gguf_name in top:
        return top[gguf_name]
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in layer:
        return f"model.layers.{parts[1]}.{layer[parts[2]]}.{parts[3]}"
    return None


def dequantized(model, arch: str):
    """``(hf_name, float32 numpy array [rows, cols])`` for every tensor of ``model`` (a ``GGUFModel``) read as an
    ``arch`` file; GGUFError at the first tensor the architecture does not have."""
    from gguf.quants import dequantize

    for t in model.reader.tensors:
        name = hf_name(t.name, arch)
        if name is None:
            raise GGUFError(f"{model.path}: unexpected tensor {t.name}")
        yield name, np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
