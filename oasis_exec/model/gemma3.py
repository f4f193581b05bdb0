"""Gemma 3 (text) in plain torch: the spec, the weights (GGUF or a Hugging Face directory) and the decoder.

What differs from the Llama family (``oasis_exec.model.Decoder``), each as transformers' ``Gemma3ForCausalLM``
computes it:

- RMSNorm multiplies by ``(1 + w)``, in float32, then casts (``norm1p``); four norms a layer (input,
  post-attention, pre- and post-feed-forward) and one on each of q and k, per head.
- Embeddings are scaled by ``sqrt(hidden)`` (the scale cast to the weights' dtype first, as transformers does); the
  LM head is the unscaled, tied embedding.
- The MLP gates with ``gelu`` (tanh approximation), not SiLU.
- Attention scales by ``query_pre_attn_scalar ** -0.5`` (folded into q when it differs from ``head_dim ** -0.5``).
- Hybrid attention: ``ModelSpec.layer_windows`` gives each layer's kind (a sliding window of ``sliding_window``
  tokens, or None: full); RoPE θ is ``rope_theta`` on full layers and ``sliding_rope_theta`` on sliding ones.

A GGUF file (llama.cpp's ``gemma3`` architecture) lacks the sliding layers' θ, the layer pattern and
``query_pre_attn_scalar``: transformers fills Gemma 3's defaults (θ 10,000, every sixth layer full, 256), and so do
we. llama.cpp stores each norm's weight as ``1 + w`` (its converter adds 1) and does not permute Gemma's Q/K rows
(only its ``llama`` converter does); ``load_gguf_gemma3`` subtracts the 1, as transformers does.
"""

from __future__ import annotations

import json
import math
import os

import torch
import torch.nn.functional as F

from oasis_core.specs import ModelSpec

from .decoder import Decoder, extend_cache, hf_shape_fields, keep_positions, rope
from .gemma3_files import (  # re-exported: the decoder's callers read them here too
    ARCH,
    LOCAL_THETA,
    PATTERN,
    QUERY_PRE_ATTN_SCALAR,
    Gemma3Arch,
    default_windows,
    gemma3_path,
    load_gguf_gemma3,
    spec_from_gguf_meta,
    spec_from_hf_config,
)

__all__ = [  # the decoder and what its callers read here (the file formats live in gemma3_files)
    "ARCH",
    "LOCAL_THETA",
    "PATTERN",
    "QUERY_PRE_ATTN_SCALAR",
    "Gemma3Arch",
    "Gemma3Decoder",
    "default_windows",
    "gemma3_path",
    "hf_config",
    "load_gguf_gemma3",
    "random_weights",
    "spec_from_gguf_meta",
    "spec_from_hf_config",
]


def norm1p(x, w, eps):
    """Gemma's RMSNorm: ``x / rms(x) * (1 + w)`` in float32, cast back to ``x``'s dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).to(x.dtype)


def _layer_names(i):
    p = f"model.layers.{i}."
    a = p + "self_attn."
    return {
        "q": a + "q_proj.weight",
        "k": a + "k_proj.weight",
        "v": a + "v_proj.weight",
        "o": a + "o_proj.weight",
        "q_norm": a + "q_norm.weight",
        "k_norm": a + "k_norm.weight",
        "ln1": p + "input_layernorm.weight",
        "post_attn": p + "post_attention_layernorm.weight",
        "ln2": p + "pre_feedforward_layernorm.weight",
        "post_ffw": p + "post_feedforward_layernorm.weight",
        "gate": p + "mlp.gate_proj.weight",
        "up": p + "mlp.up_proj.weight",
        "down": p + "mlp.down_proj.weight",
    }


NORMS = ("ln1", "post_attn", "ln2", "post_ffw", "q_norm", "k_norm")  # a layer's norm weights (_layer_names' keys)


def random_weights(spec: ModelSpec, seed: int = 0, dtype=torch.float32, device="cpu") -> dict:
    """Random Gemma-shaped weights (tests): the Llama family's, the extra norms with small random ``w``."""
    from .decoder import random_weights as llama_random

    w = llama_random(spec, seed, dtype, device)
    w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"] / math.sqrt(spec.hidden)
    g = torch.Generator().manual_seed(seed + 7)
    for i in range(spec.n_layers):
        n = _layer_names(i)
        w[n["ln2"]] = w.pop(f"model.layers.{i}.post_attention_layernorm.weight")
        for key, dim in (
            ("ln1", spec.hidden),
            ("post_attn", spec.hidden),
            ("ln2", spec.hidden),
            ("post_ffw", spec.hidden),
            ("q_norm", spec.head_dim),
            ("k_norm", spec.head_dim),
        ):
            w[n[key]] = (0.1 * torch.randn(dim, generator=g)).to(device=device, dtype=dtype)
    w["model.norm.weight"] = (0.1 * torch.randn(spec.hidden, generator=g)).to(device=device, dtype=dtype)
    return w


class Gemma3Decoder(Decoder):
    """``Decoder``'s interface (``embed_tokens``, ``qkv``, ``finish``, ``logits``, ``forward``) for Gemma 3.

    ``qkv`` applies the layer's own RoPE θ; the caller attends with the layer's window
    (``shape.layer_window(layer)``). ``fused`` (the runner's on CUDA): the elementwise ops in one Triton launch each
    (``oasis_kernels.gemma_ops``: the (1 + w) norms, the norm + residual add + norm between attention and MLP, GELU,
    q/k norm + RoPE + the query scale), else plain torch. Tensor parallelism is refused (one KV head)."""

    family = ARCH
    families = ("gemma3", "gemma3_text")  # registered with Decoder.by_family: Decoder.from_path loads them here

    def __init__(self, shape: ModelSpec, arch: Gemma3Arch, weights: dict, dtype=torch.bfloat16, fused=False, tp=None):
        if tp is not None:
            raise ValueError("Gemma 3: tensor parallelism is not supported (its KV heads cannot be split)")
        if not shape.layer_windows:
            raise ValueError("Gemma 3: the spec must give each layer's attention kind (layer_windows)")
        self.full_shape, self.tp, self.shape, self.arch, self.dtype = shape, None, shape, arch, dtype
        self.fused, self._fk, self._inv_freq = bool(fused), None, None
        self.device = weights["model.embed_tokens.weight"].device
        self.embed = weights["model.embed_tokens.weight"]
        # transformers: the scale cast to the dtype; on the weights' device (no copy inside a captured CUDA graph)
        self.embed_scale = torch.tensor(math.sqrt(shape.hidden)).to(dtype).to(self.device)
        self.norm = weights["model.norm.weight"]
        self.lm_head = self.embed
        # q scaled so that the kernels' 1 / sqrt(head_dim) becomes 1 / sqrt(query_pre_attn_scalar)
        self.q_scale = math.sqrt(shape.head_dim / arch.query_pre_attn_scalar)
        self.thetas = [shape.rope_theta if w is None else shape.rope_theta_sliding for w in shape.layer_windows]
        self.layers = []
        for i in range(shape.n_layers):
            n = _layer_names(i)
            missing = [v for v in n.values() if v not in weights]
            if missing:
                raise KeyError(f"checkpoint lacks {missing[0]} (and {len(missing) - 1} more)")
            lw = {k: weights[v] for k, v in n.items()}
            lw["qkv"] = torch.cat([lw.pop("q"), lw.pop("k"), lw.pop("v")], 0).contiguous()
            lw["gate_up"] = torch.cat([lw.pop("gate"), lw.pop("up")], 0).contiguous()
            self.layers.append(lw)
        if self.fused:
            # oasis_kernels first: its interpreter switch precedes triton
            from oasis_kernels import fused_ops, gemma_ops

            self._fk, self._gk = fused_ops, gemma_ops
            for lw in self.layers:  # the norms' 1 + w in fp32, made once
                lw.update({k + "_1p": gemma_ops.one_plus(lw[k]) for k in NORMS})
            self.norm_1p = gemma_ops.one_plus(self.norm)
            self._inv_freq = [fused_ops.rope_inv_freq(shape.head_dim, t, self.device) for t in self.thetas]

    @staticmethod
    def from_gguf(path: str, dtype=torch.bfloat16, device="cpu", fused=False, tp=None) -> "Gemma3Decoder":
        from .gguf import read_gguf

        g = read_gguf(path)
        return Gemma3Decoder(g.spec, g.arch, load_gguf_gemma3(g, dtype, device), dtype, fused, tp)

    @staticmethod
    def from_dir(path: str, dtype=torch.bfloat16, device="cpu", fused=False, tp=None) -> "Gemma3Decoder":
        from .decoder import load_safetensors_dir

        with open(os.path.join(path, "config.json")) as fh:
            spec, arch = spec_from_hf_config(json.load(fh), name=os.path.basename(path.rstrip("/")))
        w = load_safetensors_dir(path, dtype, device)
        w = {k.removeprefix("language_model."): v for k, v in w.items()}
        return Gemma3Decoder(spec, arch, w, dtype, fused, tp)

    @staticmethod
    def dummy(spec: ModelSpec, seed: int = 0, dtype=torch.bfloat16, device="cpu", fused=False, tp=None):
        """Random weights of ``spec``'s shape (``random_weights``): the executor's dummy Gemma 3."""
        return Gemma3Decoder(spec, Gemma3Arch(), random_weights(spec, seed, dtype, device), dtype, fused, tp)

    @staticmethod
    def from_path(path: str, dtype=torch.bfloat16, device="cpu", fused=False, tp=None) -> "Gemma3Decoder":
        if str(path).endswith(".gguf"):
            return Gemma3Decoder.from_gguf(path, dtype, device, fused, tp)
        return Gemma3Decoder.from_dir(path, dtype, device, fused, tp)

    def embed_tokens(self, ids):
        return self.embed[ids] * self.embed_scale

    def window(self, i: int):
        return self.shape.layer_window(i)

    def qkv(self, i: int, x, pos):
        s, lw = self.shape, self.layers[i]
        hq, hk, d = s.n_q_heads, s.n_kv_heads, s.head_dim
        if self.fused:
            y = self._gk.norm1p(x, lw["ln1_1p"], s.rms_eps) @ lw["qkv"].t()
            return self._fk.qk_norm_rope(
                y, pos, hq, hk, d, lw["q_norm_1p"], lw["k_norm_1p"], s.rms_eps, self.thetas[i], self._inv_freq[i],
                one_plus=True, q_scale=self.q_scale,
            )  # fmt: skip
        y = norm1p(x, lw["ln1"], s.rms_eps) @ lw["qkv"].t()
        q = norm1p(y[:, : hq * d].view(-1, hq, d), lw["q_norm"], s.rms_eps)
        k = norm1p(y[:, hq * d : (hq + hk) * d].view(-1, hk, d), lw["k_norm"], s.rms_eps)
        v = y[:, (hq + hk) * d :].reshape(-1, hk, d)
        q, k = rope(q, pos, self.thetas[i]), rope(k, pos, self.thetas[i])
        if self.q_scale != 1.0:
            q = q * self.q_scale
        return q, k, v.contiguous()

    def finish(self, i: int, x, attn):
        s, lw = self.shape, self.layers[i]
        o = attn.reshape(attn.shape[0], -1) @ lw["o"].t()
        if self.fused:
            gk = self._gk
            x, h = gk.post_norm_add(o, x, lw["post_attn_1p"], lw["ln2_1p"], s.rms_eps)
            m = gk.gelu_mul(h @ lw["gate_up"].t()) @ lw["down"].t()
            return gk.post_norm_add(m, x, lw["post_ffw_1p"], None, s.rms_eps)[0]
        x = x + norm1p(o, lw["post_attn"], s.rms_eps)
        g, u = (norm1p(x, lw["ln2"], s.rms_eps) @ lw["gate_up"].t()).chunk(2, dim=-1)
        m = (F.gelu(g, approximate="tanh") * u) @ lw["down"].t()
        return x + norm1p(m, lw["post_ffw"], s.rms_eps)

    def logits(self, x):
        if self.fused:
            return (self._gk.norm1p(x, self.norm_1p, self.shape.rms_eps) @ self.lm_head.t()).float()
        return (norm1p(x, self.norm, self.shape.rms_eps) @ self.lm_head.t()).float()

    def forward(self, tokens, hook=None, cache=None, start=0, keep=None):
        """``Decoder.forward`` with each layer's window (a sliding layer's query at p sees p - W + 1 .. p); the
        cache keeps every position (the reference path). ``keep``: indices into the T positions whose logits are
        returned ([B, len(keep), V]; the LM head over 262,144 tokens dominates a long CPU forward), else all."""
        tokens = torch.as_tensor(tokens, device=self.device)
        B, T = tokens.shape
        pos = torch.arange(start, start + T, device=self.device).repeat(B)
        x = self.embed_tokens(tokens.reshape(-1))
        g = self.shape.gqa_group
        for i in range(self.shape.n_layers):
            q, k, v = self.qkv(i, x, pos)
            qb, kb, vb = (t.view(B, T, t.shape[1], t.shape[2]) for t in (q, k, v))
            if cache is not None:
                kb, vb = extend_cache(cache, i, kb, vb)
            S = kb.shape[1]
            qp = torch.arange(S - T, S, device=self.device)[:, None]
            kp = torch.arange(S, device=self.device)[None, :]
            mask = kp <= qp
            w = self.window(i)
            if w is not None:
                mask = mask & (kp > qp - w)
            attn = F.scaled_dot_product_attention(
                qb.transpose(1, 2),
                kb.transpose(1, 2).repeat_interleave(g, 1),
                vb.transpose(1, 2).repeat_interleave(g, 1),
                attn_mask=mask,
            )
            attn = attn.transpose(1, 2).reshape(B * T, q.shape[1], q.shape[2])
            x = self.finish(i, x, attn)
            if hook is not None:
                hook(i, q, k, v, x)
        x, T = keep_positions(x, B, T, keep)
        return self.logits(x).view(B, T, -1)


def hf_config(spec: ModelSpec, arch: Gemma3Arch | None = None) -> dict:
    """A ``gemma3_text`` ``config.json`` of ``spec`` (tests write small random checkpoints with it)."""
    arch = arch or Gemma3Arch()
    windows = spec.layer_windows or (None,) * spec.n_layers
    window = next((w for w in windows if w is not None), 512)
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        **hf_shape_fields(spec),
        "rms_norm_eps": spec.rms_eps,
        "tie_word_embeddings": True,
        "sliding_window": window,
        "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": spec.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": spec.rope_theta_sliding},
        },
        "query_pre_attn_scalar": arch.query_pre_attn_scalar,
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    }
