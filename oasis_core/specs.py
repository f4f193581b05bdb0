"""Model, hardware, link and sparsity specifications, with the presets the project runs against.

Every spec is a frozen dataclass. Fields carry their unit in the name (``hbm_bytes``, ``latency_s``,
``max_context_tokens``); ``__post_init__`` rejects bad values with a message naming the class, the field and the
value, e.g. ``ModelSpec.n_layers: must be >= 1, got 0``. Quantities that follow from the fields (parameter counts,
weight bytes, KV bytes per token) are properties, computed once from the architecture and never stored twice.

The attention modes are ``oasis_core.modes`` (re-exported here as ``MODES`` and ``SPARSE_MODES``).
Presets live in ``MODELS``, ``HARDWARE`` and ``LINKS``; look them up with ``get_model``, ``get_hardware`` and
``get_link``, which raise ``ValueError`` naming the unknown name and the valid choices.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Mapping, Optional, Tuple

from .echo import show
from .modes import MODES, SPARSE_MODES  # noqa: F401  (re-exported; the modes live in oasis_core.modes)

# ----------------------------------------------------------------------------------------------------------------
# Field checks shared by the specs. Each raises ValueError("<Owner>.<field>: <rule>, got <value>").


def _type_name(value) -> str:
    return type(value).__name__


def _check_int(owner: str, name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}.{name}: must be an integer, got {show(value)} ({_type_name(value)})")
    if value < minimum:
        raise ValueError(f"{owner}.{name}: must be >= {minimum}, got {value}")


def _check_real(owner: str, name: str, value, *, positive: bool = True, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{owner}.{name}: must be a number, got {show(value)} ({_type_name(value)})")
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name}: must be finite, got {show(value)}")
    if positive and allow_zero and value < 0:
        raise ValueError(f"{owner}.{name}: must be >= 0, got {show(value)}")
    if positive and not allow_zero and value <= 0:
        raise ValueError(f"{owner}.{name}: must be > 0, got {show(value)}")


def _check_bool(owner: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name}: must be a bool, got {show(value)} ({_type_name(value)})")


def _check_name(owner: str, value) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{owner}.name: must be a non-empty string, got {show(value)}")


# ----------------------------------------------------------------------------------------------------------------
# Models


FAMILIES = ("llama", "gemma3")  # ModelSpec.family


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, described closely enough to size its KV cache, weights and GEMMs.

    Dense models leave ``n_experts`` at 0. A mixture-of-experts model sets ``n_experts``, ``experts_active`` and
    ``moe_mlp_hidden`` (the intermediate size of one expert); its ``mlp_hidden`` then describes no layer of the
    model and is kept only as the config's nominal dense intermediate size.
    Parameter counts are derived from the shapes (attention projections, SwiGLU MLP or experts plus router,
    RMSNorm weights, embeddings and LM head), so they can be checked against the published totals.

    Hybrid attention: ``layer_windows`` gives, per layer, how that layer attends: ``None`` for the full context, an
    integer W for a sliding window of the last W tokens (the token itself included). The empty tuple (the default)
    means every layer is full. Only full layers grow with the context, so only they have a host copy, summaries,
    selection, transfers and the draft's lookahead; a windowed layer keeps a ring of its last W tokens on the GPU
    and attends it densely. ``sliding_rope_theta`` is the RoPE base of the windowed layers (``None``: the same as
    ``rope_theta``, which is then the full layers' base). Build a periodic pattern with ``periodic_windows``.
    """

    name: str
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    mlp_hidden: int
    vocab: int
    max_context_tokens: int
    dtype_bytes: int = 2
    qk_norm: bool = False
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    n_experts: int = 0
    experts_active: int = 0
    moe_mlp_hidden: int = 0
    layer_windows: Tuple[Optional[int], ...] = ()  # per layer: None = full attention, W = sliding window of W tokens
    sliding_rope_theta: Optional[float] = None  # RoPE base of the windowed layers; None = rope_theta
    expert_bytes_per_param: Optional[float] = None  # MoE experts' storage (MXFP4: 0.53125 B); None = dtype_bytes
    # what a layer computes beyond the shapes: "llama" (RMSNorm, SwiGLU) or "gemma3" ((1 + w) norms around attention
    # and MLP, q/k norms, GELU); the executor's dummy weights build this family's decoder
    family: str = "llama"

    def __post_init__(self):
        owner = "ModelSpec"
        _check_name(owner, self.name)
        for name in (
            "n_layers",
            "n_q_heads",
            "n_kv_heads",
            "head_dim",
            "hidden",
            "mlp_hidden",
            "vocab",
            "max_context_tokens",
            "dtype_bytes",
        ):
            _check_int(owner, name, getattr(self, name), 1)
        for name in ("n_experts", "experts_active", "moe_mlp_hidden"):
            _check_int(owner, name, getattr(self, name), 0)
        for name in ("qk_norm", "tie_embeddings"):
            _check_bool(owner, name, getattr(self, name))
        if self.family not in FAMILIES:
            raise ValueError(f"{owner}.family: one of {', '.join(FAMILIES)}, got {self.family!r}")
        _check_real(owner, "rope_theta", self.rope_theta)
        _check_real(owner, "rms_eps", self.rms_eps)
        if self.n_q_heads % self.n_kv_heads:
            raise ValueError(
                f"{owner}.n_q_heads: must be a multiple of n_kv_heads ({self.n_kv_heads}), got {self.n_q_heads}"
            )
        if self.n_experts:
            if not 1 <= self.experts_active <= self.n_experts:
                raise ValueError(
                    f"{owner}.experts_active: must be in [1, n_experts={self.n_experts}] "
                    f"for a mixture-of-experts model, got {self.experts_active}"
                )
            if self.moe_mlp_hidden < 1:
                raise ValueError(
                    f"{owner}.moe_mlp_hidden: must be >= 1 for a mixture-of-experts model, got {self.moe_mlp_hidden}"
                )
        else:
            for name in ("experts_active", "moe_mlp_hidden"):
                if getattr(self, name):
                    raise ValueError(
                        f"{owner}.{name}: must be 0 for a dense model (n_experts=0), got {getattr(self, name)}"
                    )
        _check_windows(owner, self.layer_windows, self.n_layers)
        if self.sliding_rope_theta is not None:
            _check_real(owner, "sliding_rope_theta", self.sliding_rope_theta)
        if self.expert_bytes_per_param is not None:
            _check_real(owner, "expert_bytes_per_param", self.expert_bytes_per_param)
            if not self.n_experts:
                raise ValueError(
                    f"{owner}.expert_bytes_per_param: must be None for a dense model (n_experts=0), "
                    f"got {self.expert_bytes_per_param!r}"
                )

    # -- per-layer attention kind -----------------------------------------------------------------------------
    def layer_window(self, layer: int) -> Optional[int]:
        """The window of layer ``layer`` in tokens, or ``None`` when it attends the full context."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"ModelSpec.layer_window: layer must be in [0, {self.n_layers}), got {layer}")
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def is_hybrid(self) -> bool:
        """True when some layer attends a sliding window."""
        return any(w is not None for w in self.layer_windows)

    @cached_property  # asked per request per step by the simulator's accounting: computed once
    def full_layers(self) -> Tuple[int, ...]:
        """Indices of the full-attention layers, ascending (every layer for a model without windows)."""
        return tuple(l for l in range(self.n_layers) if self.layer_window(l) is None)

    @cached_property  # asked per request per step by the simulator's accounting: computed once
    def sliding_layers(self) -> Tuple[int, ...]:
        """Indices of the sliding-window layers, ascending (none for a model without windows)."""
        return tuple(l for l in range(self.n_layers) if self.layer_window(l) is not None)

    @cached_property
    def n_full_layers(self) -> int:
        return len(self.full_layers)

    @property
    def rope_theta_sliding(self) -> float:
        """The RoPE base a windowed layer uses."""
        return self.rope_theta if self.sliding_rope_theta is None else self.sliding_rope_theta

    # -- shape facts ------------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def gqa_group(self) -> int:
        """Query heads sharing one KV head."""
        return self.n_q_heads // self.n_kv_heads

    @property
    def q_dim(self) -> int:
        return self.n_q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of one of K or V for one token of one layer (all KV heads)."""
        return self.n_kv_heads * self.head_dim

    # -- parameter counts -------------------------------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        proj = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden  # Q, K, V, O
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return proj + qk_norm

    @property
    def mlp_params_per_layer(self) -> int:
        """All MLP parameters of one layer: the SwiGLU MLP, or every expert plus the router."""
        if self.is_moe:
            return self.n_experts * 3 * self.hidden * self.moe_mlp_hidden + self.hidden * self.n_experts
        return 3 * self.hidden * self.mlp_hidden

    @property
    def active_mlp_params_per_layer(self) -> int:
        """MLP parameters one token touches in one layer."""
        if self.is_moe:
            return self.experts_active * 3 * self.hidden * self.moe_mlp_hidden + self.hidden * self.n_experts
        return self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (counted once when tied)."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    def params_total(self) -> int:
        norms = 2 * self.hidden  # two RMSNorms per layer
        per_layer = self.attn_params_per_layer + self.mlp_params_per_layer + norms
        return self.n_layers * per_layer + self.embedding_params + self.hidden  # + final norm

    @property
    def params_active(self) -> int:
        """Parameters read per token: all of them for a dense model, the routed experts only for MoE."""
        norms = 2 * self.hidden
        per_layer = self.attn_params_per_layer + self.active_mlp_params_per_layer + norms
        return self.n_layers * per_layer + self.embedding_params + self.hidden

    # -- bytes ------------------------------------------------------------------------------------------------
    def _expert_params_per_layer(self, experts: int) -> int:
        return experts * 3 * self.hidden * self.moe_mlp_hidden

    def _with_experts(self, params: int, experts: int) -> int:
        """Bytes of ``params`` parameters of which ``experts`` experts' matrices a layer are stored at
        ``expert_bytes_per_param`` and the rest at ``dtype_bytes``."""
        if self.expert_bytes_per_param is None:
            return params * self.dtype_bytes
        e = self._expert_params_per_layer(experts) * self.n_layers
        return int(round((params - e) * self.dtype_bytes + e * self.expert_bytes_per_param))

    @property
    def weight_bytes(self) -> int:
        return self._with_experts(self.params_total, self.n_experts)

    @property
    def active_weight_bytes(self) -> int:
        return self._with_experts(self.params_active, self.experts_active)

    @property
    def layer_active_weight_bytes(self) -> int:
        """Weight bytes one decode token reads in one layer: attention and the active MLP (routed experts at
        ``expert_bytes_per_param``)."""
        params = self.attn_params_per_layer + self.active_mlp_params_per_layer
        if self.expert_bytes_per_param is None:
            return params * self.dtype_bytes
        e = self._expert_params_per_layer(self.experts_active)
        return int(round((params - e) * self.dtype_bytes + e * self.expert_bytes_per_param))

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers and KV heads, at the model's dtype (paper eq. 1 with B = L = 1).
        For a hybrid model this is what a cache without windows would hold; see ``kv_bytes`` for the real size."""
        return self.n_layers * self.kv_bytes_per_token_layer

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer, all KV heads."""
        return 2 * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def full_kv_bytes_per_token(self) -> int:
        """K and V of one token over the full-attention layers only: what grows with the context."""
        return self.n_full_layers * self.kv_bytes_per_token_layer

    @property
    def window_kv_bytes(self) -> int:
        """The fixed bytes of every windowed layer's ring of W tokens, one request (0 without windows)."""
        return sum(self.layer_windows[l] for l in self.sliding_layers) * self.kv_bytes_per_token_layer

    def window_kv_bytes_at(self, context_tokens: int) -> int:
        """The windowed layers' K and V of one request at ``context_tokens`` tokens: min(context, W) a layer."""
        return sum(min(context_tokens, self.layer_windows[l]) for l in self.sliding_layers) * (
            self.kv_bytes_per_token_layer
        )

    def kv_bytes(self, context_tokens: int) -> int:
        """K and V of one request at ``context_tokens`` tokens: the full layers' every token plus each window's
        last min(context, W) tokens (``context_tokens * kv_bytes_per_token`` for a model without windows)."""
        return context_tokens * self.full_kv_bytes_per_token + self.window_kv_bytes_at(context_tokens)


def _check_windows(owner: str, windows, n_layers: int) -> None:
    if not isinstance(windows, tuple):
        raise ValueError(f"{owner}.layer_windows: must be a tuple, got {windows!r} ({_type_name(windows)})")
    if windows and len(windows) != n_layers:
        raise ValueError(
            f"{owner}.layer_windows: must be empty or hold one entry per layer ({n_layers}), got {len(windows)}"
        )
    for l, w in enumerate(windows):
        if w is not None and (isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 1):
            raise ValueError(f"{owner}.layer_windows[{l}]: must be None (full) or an integer >= 1, got {w!r}")


def periodic_windows(n_layers: int, window: int, period: int, full_at: int) -> Tuple[Optional[int], ...]:
    """``layer_windows`` of a model whose layer ``l`` is full when ``l % period == full_at`` and a window of
    ``window`` tokens otherwise: Gemma 3 is ``period=6, full_at=5`` (layers 5, 11, 17, ...), GPT-OSS
    ``period=2, full_at=1`` (odd layers full)."""
    for name, value, minimum in (("n_layers", n_layers, 1), ("window", window, 1), ("period", period, 1)):
        _check_int("periodic_windows", name, value, minimum)
    _check_int("periodic_windows", "full_at", full_at, 0)
    if full_at >= period:
        raise ValueError(f"periodic_windows.full_at: must be in [0, period={period}), got {full_at}")
    return tuple(None if l % period == full_at else window for l in range(n_layers))


# Sources: the HuggingFace config.json of each model (hidden_size, intermediate_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, head_dim, vocab_size, max_position_embeddings, rope_theta,
# rms_norm_eps, tie_word_embeddings):
#   Qwen/Qwen3-8B          https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
#   Qwen/Qwen3-32B         https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json
#   Qwen/Qwen3-235B-A22B   https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json
#                          (num_experts 128, num_experts_per_tok 8, moe_intermediate_size 1536)
#   meta-llama/Llama-3.1-8B https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
# Published totals the derived counts are tested against: Qwen3 model cards (8.2B, 32.8B, 235B total / 22B
# active) and the Llama 3.1 model card (8.03B). Qwen3's max_position_embeddings is 40,960 (32,768 native context
# plus room for output; YaRN extends it to 131,072, which these presets do not assume).
MODELS: Mapping[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            name="qwen3-8b",
            n_layers=36,
            n_q_heads=32,
            n_kv_heads=8,
            head_dim=128,
            hidden=4096,
            mlp_hidden=12288,
            vocab=151936,
            max_context_tokens=40960,
            qk_norm=True,
            rope_theta=1e6,
            rms_eps=1e-6,
        ),
        ModelSpec(
            name="qwen3-32b",
            n_layers=64,
            n_q_heads=64,
            n_kv_heads=8,
            head_dim=128,
            hidden=5120,
            mlp_hidden=25600,
            vocab=151936,
            max_context_tokens=40960,
            qk_norm=True,
            rope_theta=1e6,
            rms_eps=1e-6,
        ),
        ModelSpec(
            name="qwen3-235b-a22b",
            n_layers=94,
            n_q_heads=64,
            n_kv_heads=4,
            head_dim=128,
            hidden=4096,
            mlp_hidden=12288,
            vocab=151936,
            max_context_tokens=40960,
            qk_norm=True,
            rope_theta=1e6,
            rms_eps=1e-6,
            n_experts=128,
            experts_active=8,
            moe_mlp_hidden=1536,
        ),
        ModelSpec(
            name="llama-3.1-8b",
            n_layers=32,
            n_q_heads=32,
            n_kv_heads=8,
            head_dim=128,
            hidden=4096,
            mlp_hidden=14336,
            vocab=128256,
            max_context_tokens=131072,
            qk_norm=False,
            rope_theta=5e5,
            rms_eps=1e-5,
        ),
        # The one real model here (SmolLM2-135M-Instruct, ../shared/models/README.md): the simulator at its shape.
        ModelSpec(
            name="smollm2-135m",
            n_layers=30,
            n_q_heads=9,
            n_kv_heads=3,
            head_dim=64,
            hidden=576,
            mlp_hidden=1536,
            vocab=49152,
            max_context_tokens=8192,
            qk_norm=False,
            rope_theta=1e5,
            rms_eps=1e-5,
            tie_embeddings=True,
        ),
        # Hybrid models: a few full layers among sliding-window ones (ModelSpec.layer_windows).
        # Gemma 3 270M, the second real model here (../shared/models/README.md; the GGUF's metadata and
        # transformers' Gemma3TextConfig, https://huggingface.co/google/gemma-3-270m/blob/main/config.json):
        # layer_types full at 5, 11, 17 (sliding_window_pattern 6), sliding_window 512, RoPE 1e6 full / 1e4 local.
        # Its gated MLP is GELU-tanh (same three matrices as SwiGLU) and it has four norms a layer (two counted here).
        ModelSpec(
            name="gemma3-270m",
            n_layers=18,
            n_q_heads=4,
            n_kv_heads=1,
            head_dim=256,
            hidden=640,
            mlp_hidden=2048,
            vocab=262144,
            max_context_tokens=32768,
            qk_norm=True,
            rope_theta=1e6,
            rms_eps=1e-6,
            tie_embeddings=True,
            layer_windows=periodic_windows(18, 512, period=6, full_at=5),
            sliding_rope_theta=1e4,
            family="gemma3",
        ),
        # Gemma 3 27B (text part): https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json text_config
        # (hidden_size 5376, intermediate_size 21504, num_hidden_layers 62, num_attention_heads 32,
        # num_key_value_heads 16, head_dim 128, sliding_window 1024, sliding_window_pattern 6 -> 5 local : 1 global,
        # vocab_size 262208, max_position_embeddings 131072, RoPE 1e6 global with linear scaling x8 / 1e4 local);
        # Gemma 3 technical report (arXiv 2503.19786), 5:1 local:global with 1024-token windows, 128K context.
        ModelSpec(
            name="gemma3-27b",
            n_layers=62,
            n_q_heads=32,
            n_kv_heads=16,
            head_dim=128,
            hidden=5376,
            mlp_hidden=21504,
            vocab=262208,
            max_context_tokens=131072,
            qk_norm=True,
            rope_theta=1e6,
            rms_eps=1e-6,
            tie_embeddings=True,
            layer_windows=periodic_windows(62, 1024, period=6, full_at=5),
            sliding_rope_theta=1e4,
            family="gemma3",
        ),
        # GPT-OSS-120B: https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json (num_hidden_layers 36,
        # layer_types alternating sliding_attention / full_attention from layer 0, sliding_window 128,
        # num_attention_heads 64, num_key_value_heads 8, head_dim 64, hidden_size 2880, intermediate_size 2880,
        # num_local_experts 128, num_experts_per_tok 4, vocab_size 201088, max_position_embeddings 131072,
        # rope_theta 150000 with YaRN x32, rms_norm_eps 1e-5, untied); the same values are transformers'
        # GptOssConfig defaults. Model card (arXiv 2508.10925): 116.8B total parameters, MoE weights in MXFP4 (4.25
        # bits a parameter: 4-bit values and one 8-bit scale per 32) so that the model fits one 80 GB GPU; the rest
        # bf16. Not modelled: attention biases and per-head sinks (a few MB).
        ModelSpec(
            name="gpt-oss-120b",
            n_layers=36,
            n_q_heads=64,
            n_kv_heads=8,
            head_dim=64,
            hidden=2880,
            mlp_hidden=2880,
            vocab=201088,
            max_context_tokens=131072,
            qk_norm=False,
            rope_theta=1.5e5,
            rms_eps=1e-5,
            n_experts=128,
            experts_active=4,
            moe_mlp_hidden=2880,
            layer_windows=periodic_windows(36, 128, period=2, full_at=1),
            expert_bytes_per_param=4.25 / 8,
        ),
        # A toy shape for CPU tests: small enough to run a real forward pass in milliseconds.
        ModelSpec(
            name="tiny",
            n_layers=2,
            n_q_heads=4,
            n_kv_heads=2,
            head_dim=16,
            hidden=64,
            mlp_hidden=128,
            vocab=256,
            max_context_tokens=4096,
            qk_norm=True,
            rope_theta=1e4,
            rms_eps=1e-6,
        ),
    )
}


def head_split(n: int, size: int) -> list:
    """Tensor parallelism: ``[(lo, hi), ...]``, ``n`` units (KV heads, MLP columns) cut into ``size`` contiguous
    runs, the first ``n % size`` runs one longer (3 KV heads over 2 ranks: 2 + 1); ValueError when a rank would get
    none."""
    _check_int("head_split", "size", size, 1)
    if n < size:
        raise ValueError(f"tensor_parallel={size}: cannot split {n} heads (a rank would own none)")
    q, r = divmod(n, size)
    out, lo = [], 0
    for i in range(size):
        hi = lo + q + (i < r)
        out.append((lo, hi))
        lo = hi
    return out


def tp_local(model: ModelSpec, size: int, rank: int = 0) -> ModelSpec:
    """The share of ``model`` that rank ``rank`` of ``size`` tensor-parallel ranks holds: the KV heads of
    ``head_split``, their query heads and its run of the MLP columns; all else (layers, hidden, vocabulary: the
    embedding and LM head are replicated) the model's. Rank 0 holds the largest share."""
    if size == 1:
        return model
    k0, k1 = head_split(model.n_kv_heads, size)[rank]
    m0, m1 = head_split(model.mlp_hidden, size)[rank]
    g = model.gqa_group
    return replace(model, n_q_heads=(k1 - k0) * g, n_kv_heads=k1 - k0, mlp_hidden=m1 - m0)


# ----------------------------------------------------------------------------------------------------------------
# Links


@dataclass(frozen=True)
class LinkSpec:
    """A point-to-point link. Rates are per direction.

    ``bytes_per_s`` is the nominal (theoretical) rate; ``effective_bytes_per_s`` is what a large pinned transfer
    achieves in practice (defaults to the nominal rate when unknown). ``latency_s`` is the fixed cost of one
    transfer, so moving ``n`` bytes in one transfer takes ``latency_s + n / effective_bytes_per_s``.
    """

    name: str
    bytes_per_s: float
    latency_s: float
    effective_bytes_per_s: Optional[float] = None

    def __post_init__(self):
        _check_name("LinkSpec", self.name)
        _check_real("LinkSpec", "bytes_per_s", self.bytes_per_s)
        _check_real("LinkSpec", "latency_s", self.latency_s, allow_zero=True)
        if self.effective_bytes_per_s is not None:
            _check_real("LinkSpec", "effective_bytes_per_s", self.effective_bytes_per_s)
            if self.effective_bytes_per_s > self.bytes_per_s:
                raise ValueError(
                    f"LinkSpec.effective_bytes_per_s: must be <= bytes_per_s ({show(self.bytes_per_s)}), "
                    f"got {show(self.effective_bytes_per_s)}"
                )

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.bytes_per_s if self.effective_bytes_per_s is None else self.effective_bytes_per_s

    def transfer_s(self, n_bytes: float, n_transfers: int = 1) -> float:
        """Time to move ``n_bytes`` split over ``n_transfers`` back-to-back transfers."""
        return n_transfers * self.latency_s + n_bytes / self.achieved_bytes_per_s


# PCIe Gen5 x16: 32 GT/s x 16 lanes with 128b/130b coding ~= 63 GB/s per direction, quoted as 64 GB/s (PCI-SIG
# PCIe 5.0 base specification; the paper uses 64 GB/s). Effective: 55.3 GB/s for a 1 GiB pinned host->GPU copy on
# the H200 machine here (DESIGN.md, "Measured on the GPU machine here"); the paper reports PCIe saturating at
# 30-34 GB/s effective for its scattered block traffic. Latency: 20 us per transfer is what one `copy_` per 4 KiB
# block achieves here (0.2 GB/s, DESIGN.md) -- an upper bound that includes framework dispatch.
# RoCE 400G: 400 Gb/s line rate = 50 GB/s per direction. Latency 5 us per RDMA transfer is an estimate, not a
# measurement.
LINKS: Mapping[str, LinkSpec] = {
    l.name: l
    for l in (
        LinkSpec(name="pcie-gen5-x16", bytes_per_s=64e9, latency_s=20e-6, effective_bytes_per_s=55.3e9),
        LinkSpec(name="roce-400g", bytes_per_s=50e9, latency_s=5e-6),
        # NVLink 4 between two GPUs of an H100 / H200 node: 900 GB/s both ways, 450 GB/s a direction (NVIDIA's
        # datasheets); the latency is NCCL's order for a small all-reduce, assumed until the two-GPU run measures it
        # (experiments/two_gpu_split/steps/tp2.sh)
        LinkSpec(name="nvlink-4", bytes_per_s=450e9, latency_s=15e-6),
    )
}


# ----------------------------------------------------------------------------------------------------------------
# Hardware


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU and the host it sits in.

    Datasheet figures are required. ``measured_*`` figures come from benchmarks on a real machine and are ``None``
    when nobody has measured them; the ``*_bytes_per_s`` properties fall back to the datasheet / link figures.
    Gather rates are tuples of ``(n_blocks, bytes_per_s)`` pairs for random 4 KiB blocks, ascending in n_blocks.
    """

    name: str
    hbm_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float  # dense tensor-core FLOP/s, no structured sparsity
    n_sms: int
    pcie_link: str  # a key of LINKS
    host_dram_bytes: int  # per node
    gpus_per_node: int = 1
    measured_h2d_bytes_per_s: Optional[float] = None  # pinned host -> GPU, one large copy
    measured_d2h_bytes_per_s: Optional[float] = None
    measured_pageable_h2d_bytes_per_s: Optional[float] = None
    measured_hbm_copy_bytes_per_s: Optional[float] = None  # device-to-device copy, read + write counted
    measured_attn_read_bytes_per_s: Optional[float] = None  # KV bytes read per second by decode attention
    measured_uva_gather_bytes_per_s: Tuple[Tuple[int, float], ...] = ()
    measured_cpu_gather_bytes_per_s: Tuple[Tuple[int, float], ...] = ()

    def __post_init__(self):
        owner = "HardwareSpec"
        _check_name(owner, self.name)
        for name in ("hbm_bytes", "n_sms", "host_dram_bytes", "gpus_per_node"):
            _check_int(owner, name, getattr(self, name), 1)
        for name in ("hbm_bytes_per_s", "bf16_flops"):
            _check_real(owner, name, getattr(self, name))
        for name in (
            "measured_h2d_bytes_per_s",
            "measured_d2h_bytes_per_s",
            "measured_pageable_h2d_bytes_per_s",
            "measured_hbm_copy_bytes_per_s",
            "measured_attn_read_bytes_per_s",
        ):
            if getattr(self, name) is not None:
                _check_real(owner, name, getattr(self, name))
        if self.pcie_link not in LINKS:
            raise ValueError(f"{owner}.pcie_link: must be one of {sorted(LINKS)}, got {show(self.pcie_link)}")
        for name in ("measured_uva_gather_bytes_per_s", "measured_cpu_gather_bytes_per_s"):
            pairs = getattr(self, name)
            last = 0
            for pair in pairs:
                if not (isinstance(pair, tuple) and len(pair) == 2):
                    raise ValueError(f"{owner}.{name}: must hold (n_blocks, bytes_per_s) pairs, got {show(pair)}")
                _check_int(owner, name, pair[0], last + 1)
                _check_real(owner, name, pair[1])
                last = pair[0]

    @property
    def link(self) -> LinkSpec:
        return LINKS[self.pcie_link]

    @property
    def h2d_bytes_per_s(self) -> float:
        """Best known host -> GPU rate for large pinned copies."""
        return self.measured_h2d_bytes_per_s or self.link.achieved_bytes_per_s

    @property
    def d2h_bytes_per_s(self) -> float:
        return self.measured_d2h_bytes_per_s or self.link.achieved_bytes_per_s

    @property
    def attn_read_bytes_per_s(self) -> float:
        """Rate at which decode attention reads KV: measured if known, else the HBM datasheet figure."""
        return self.measured_attn_read_bytes_per_s or self.hbm_bytes_per_s

    @property
    def host_dram_bytes_per_gpu(self) -> int:
        return self.host_dram_bytes // self.gpus_per_node


_GB = 10**9
_GIB = 2**30

# H100 SXM5: 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s dense BF16 (1,979 with sparsity), 132 SMs, PCIe Gen5 x16
# (NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/). "80 GB" is 80 GiB of
# HBM on the device (81,559 MiB usable per nvidia-smi); we use 80e9 bytes, the paper's budget figure. Host:
# DGX H100 has 2 TB of system memory for 8 GPUs (NVIDIA DGX H100 datasheet); the paper runs on 8x H100.
# H200 SXM: 141 GB HBM3e at 4.8 TB/s, same GH100 compute as H100 (NVIDIA H200 datasheet,
# https://www.nvidia.com/en-us/data-center/h200/). The measured figures and the 128 GiB of host memory are those of
# the one-H200 machine here (DESIGN.md, "Measured on the GPU machine here", 2026-11-29).
HARDWARE: Mapping[str, HardwareSpec] = {
    h.name: h
    for h in (
        HardwareSpec(
            name="h100-sxm",
            hbm_bytes=80 * _GB,
            hbm_bytes_per_s=3.35e12,
            bf16_flops=989e12,
            n_sms=132,
            pcie_link="pcie-gen5-x16",
            host_dram_bytes=2048 * _GB,
            gpus_per_node=8,
        ),
        HardwareSpec(
            name="h200",
            hbm_bytes=141 * _GB,
            hbm_bytes_per_s=4.8e12,
            bf16_flops=989e12,
            n_sms=132,
            pcie_link="pcie-gen5-x16",
            host_dram_bytes=128 * _GIB,
            gpus_per_node=1,
            measured_h2d_bytes_per_s=55.3e9,
            measured_d2h_bytes_per_s=55.1e9,
            measured_pageable_h2d_bytes_per_s=6.2e9,
            measured_hbm_copy_bytes_per_s=3.83e12,
            measured_attn_read_bytes_per_s=4.3e12,
            measured_uva_gather_bytes_per_s=((256, 21e9), (4096, 46e9), (32768, 49e9)),
            measured_cpu_gather_bytes_per_s=((256, 0.3e9), (4096, 28.6e9), (32768, 30.6e9)),
        ),
    )
}


# ----------------------------------------------------------------------------------------------------------------
# Sparsity


@dataclass(frozen=True)
class SparsityConfig:
    """The paper's sparse-attention defaults: 16-token blocks, top-128 blocks per KV head plus the newest (local)
    block, and a fetch cap of 5% of K per head per step."""

    block_size: int = 16
    top_k: int = 128
    fetch_ratio: float = 0.05
    local_blocks: int = 1

    def __post_init__(self):
        owner = "SparsityConfig"
        _check_int(owner, "block_size", self.block_size, 1)
        _check_int(owner, "top_k", self.top_k, 1)
        _check_int(owner, "local_blocks", self.local_blocks, 0)
        _check_real(owner, "fetch_ratio", self.fetch_ratio)
        if self.fetch_ratio > 1:
            raise ValueError(f"{owner}.fetch_ratio: must be in (0, 1], got {show(self.fetch_ratio)}")

    @property
    def resident_blocks(self) -> int:
        """Blocks per (request, layer, KV head) held on the GPU: top-K plus the local blocks (129 by default)."""
        return self.top_k + self.local_blocks

    @property
    def resident_tokens(self) -> int:
        return self.resident_blocks * self.block_size


PAPER_SPARSITY = SparsityConfig()  # the defaults of the simulator's and the executor's configs


# ----------------------------------------------------------------------------------------------------------------
# Lookup


def _lookup(kind: str, table: Mapping, name):
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown {kind} {show(name)}; choose one of: {', '.join(sorted(table))}")
    return table[name]


def get_model(name: str) -> ModelSpec:
    return _lookup("model", MODELS, name)


def get_hardware(name: str) -> HardwareSpec:
    return _lookup("hardware", HARDWARE, name)


def get_link(name: str) -> LinkSpec:
    return _lookup("link", LINKS, name)
