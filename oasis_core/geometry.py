"""KV-cache block geometry: how many bytes a token, a block and a (block, head) slice occupy, and the paper's
capacity formulas built on them.

Units: bytes, tokens, blocks, seconds. ``L`` is a context length in tokens, ``B`` a number of requests.
A *block* holds ``block_size`` consecutive tokens of one request; a *(block, head)* slice is one block of one KV
head of one layer -- the unit that the sparse policy selects, fetches and evicts.

Hybrid models (``ModelSpec.layer_windows``): only the full-attention layers hold the whole context, so only they
have a host copy, block summaries and a sparse working set; ``rows_per_request``, the host copy's bytes, the resident
set and the summaries count full layers only. A windowed layer keeps a ring of its last W tokens on the GPU:
``window_bytes(L)``, a fixed size once ``L >= W``. ``dense_bytes(L)`` is the whole KV of an ``L``-token request
(full layers' every token plus the windows). For a model without windows every layer is full and nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .echo import show
from .specs import ModelSpec, _check_int, _check_real

# The host copy's element type (``ExecConfig.host_kv_dtype``, ``SimConfig.host_kv_dtype``): "auto" = the KV dtype
# (``dtype_bytes``); "fp8_e4m3" = one byte per element plus one float32 scale per (layer, block, KV head) of K and
# one of V (``oasis_exec.kv.host_quant``). Only the host pool and what crosses host->GPU change; the GPU keeps
# ``dtype_bytes``.
HOST_KV_DTYPES = ("auto", "fp8_e4m3")
FP8_SCALE_BYTES = 4


@dataclass(frozen=True)
class KVGeometry:
    """Byte sizes of the KV cache of ``model`` cut into blocks of ``block_size`` tokens.

    ``dtype_bytes`` is the KV-cache element size (2 for bf16/fp16, 1 for an fp8 cache); it is independent of the
    model's weight dtype.
    """

    model: ModelSpec
    block_size: int = 16
    dtype_bytes: int = 2
    token_rank: int = 0  # block_score=tokens: channels kept a token (oasis_core.token_scorer); 0: min/max summaries

    def __post_init__(self):
        if not isinstance(self.model, ModelSpec):
            raise ValueError(f"KVGeometry.model: must be a ModelSpec, got {show(self.model)}")
        _check_int("KVGeometry", "block_size", self.block_size, 1)
        _check_int("KVGeometry", "dtype_bytes", self.dtype_bytes, 1)
        _check_int("KVGeometry", "token_rank", self.token_rank, 0)

    # -- per token ----------------------------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        """K and V of one token, all layers and KV heads: ``N_layer * 2 * N_kv * d_h * s`` (a hybrid model's
        windowed layers included, as if they held every token: see ``full_bytes_per_token``)."""
        m = self.model
        return m.n_layers * 2 * m.n_kv_heads * m.head_dim * self.dtype_bytes

    @property
    def bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer (all KV heads)."""
        return 2 * self.model.n_kv_heads * self.model.head_dim * self.dtype_bytes

    @property
    def full_bytes_per_token(self) -> int:
        """K and V of one token over the full-attention layers: what grows with the context (``bytes_per_token``
        for a model without windows)."""
        return self.model.n_full_layers * self.bytes_per_token_layer

    def window_bytes(self, L: int) -> int:
        """K and V the windowed layers hold for an ``L``-token request: ``min(L, W)`` tokens a layer (0 without
        windows; ``ModelSpec.window_kv_bytes`` at the KV dtype once ``L`` reaches every window)."""
        m = self.model
        if not m.layer_windows:
            return 0
        return sum(min(L, m.layer_windows[l]) for l in m.sliding_layers) * self.bytes_per_token_layer

    def dense_bytes(self, L: int) -> int:
        """The whole KV of an ``L``-token request on the GPU: ``L`` tokens of every full layer plus the windows
        (``L * bytes_per_token`` for a model without windows)."""
        return L * self.full_bytes_per_token + self.window_bytes(L)

    # -- per block ----------------------------------------------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        """K and V of one block, all layers and KV heads."""
        return self.block_size * self.bytes_per_token

    @property
    def bytes_per_block_head(self) -> int:
        """K and V of one block of one KV head in one layer: the unit a fetch moves (8 KiB for d_h 128, bf16)."""
        return 2 * self.block_size * self.model.head_dim * self.dtype_bytes

    @property
    def bytes_per_block_head_half(self) -> int:
        """One of K or V of one block of one KV head in one layer (4 KiB for d_h 128, bf16)."""
        return self.block_size * self.model.head_dim * self.dtype_bytes

    def host_bytes_per_block_head(self, host_kv_dtype: str = "auto") -> int:
        """K and V of one block of one KV head in one layer as the host copy holds it -- the bytes a fetch moves
        host->GPU: ``bytes_per_block_head`` for "auto", ``2 * (block_size * d_h + 4)`` for "fp8_e4m3" (the codes
        and the unit's two float32 scales: 4,104 bytes at 16 x 128, against 8,192 in bf16)."""
        if host_kv_dtype == "auto":
            return self.bytes_per_block_head
        if host_kv_dtype == "fp8_e4m3":
            return 2 * (self.block_size * self.model.head_dim + FP8_SCALE_BYTES)
        raise ValueError(f"host_kv_dtype: must be one of {', '.join(HOST_KV_DTYPES)}, got {show(host_kv_dtype)}")

    def host_bytes_per_block(self, host_kv_dtype: str = "auto") -> int:
        """K and V of one block, all full layers and KV heads, in the host copy (``host_bytes_per_block_head`` x
        rows)."""
        return self.host_bytes_per_block_head(host_kv_dtype) * self.rows_per_request

    def host_bytes_per_token(self, host_kv_dtype: str = "auto") -> float:
        """``host_bytes_per_block / block_size``: a token's share of its block's host copy (float for fp8; full
        layers only)."""
        if host_kv_dtype == "auto":
            return float(self.full_bytes_per_token)
        return self.host_bytes_per_block(host_kv_dtype) / self.block_size

    @property
    def rows_per_request(self) -> int:
        """(layer, KV head) rows one request contributes to the policy's row dimension R: the full-attention layers
        only (every layer for a model without windows)."""
        return self.model.n_full_layers * self.model.n_kv_heads

    def n_blocks(self, L: int) -> int:
        """Blocks covering ``L`` tokens (the last one may be partly filled)."""
        _check_int("KVGeometry.n_blocks", "L", L, 0)
        return -(-L // self.block_size)

    # -- paper formulas -----------------------------------------------------------------------------------------
    def m_kv(self, B: int, L: int) -> int:
        """Paper eq. 1: ``M_KV(B, L) = B * L * N_layer * 2 * N_kv * d_h * s`` bytes (dense, token granularity); for a
        hybrid model ``B * dense_bytes(L)`` (the windowed layers hold ``min(L, W)`` tokens)."""
        _check_int("KVGeometry.m_kv", "B", B, 0)
        _check_int("KVGeometry.m_kv", "L", L, 0)
        return B * self.dense_bytes(L)

    def b_max(self, budget_bytes: float, L: int) -> int:
        """Largest number of ``L``-token requests whose dense KV fits in ``budget_bytes``: ``floor(budget / M_KV(1, L))``."""
        _check_real("KVGeometry.b_max", "budget_bytes", budget_bytes, allow_zero=True)
        _check_int("KVGeometry.b_max", "L", L, 1)
        return int(budget_bytes // self.m_kv(1, L))

    def resident_bytes(self, top_k: int, local_blocks: int = 1) -> int:
        """GPU bytes of one request's sparse working set: ``top_k + local_blocks`` blocks in every full layer and KV
        head (the resident set is per head, so each head holds its own ``top_k`` blocks); the windows are apart
        (``window_bytes``)."""
        _check_int("KVGeometry.resident_bytes", "top_k", top_k, 0)
        _check_int("KVGeometry.resident_bytes", "local_blocks", local_blocks, 0)
        return (top_k + local_blocks) * self.rows_per_request * self.bytes_per_block_head

    @property
    def summary_bytes_per_block_head(self) -> int:
        """Min and max key vectors of one block of one KV head: ``2 * d_h * s``; with ``token_rank`` (the per-token
        scorer) ``block_size * token_rank * s``, the channels every token keeps."""
        if self.token_rank:
            return self.block_size * self.token_rank * self.dtype_bytes
        return 2 * self.model.head_dim * self.dtype_bytes

    def summary_bytes(self, L: int) -> int:
        """Bytes of the block summaries of an ``L``-token context, all full layers and KV heads. At 16-token blocks
        this is 1/16 of the blocks' K+V bytes (two vectors per block instead of 2 x 16)."""
        return self.n_blocks(L) * self.rows_per_request * self.summary_bytes_per_block_head


def c_token(link_bytes_per_s: float, t_decode_s: float, bytes_per_token: float) -> float:
    """Paper eq. 3: tokens that can be newly activated per decode step, ``B_link * T_decode / bytes_per_token``.

    What a "token" costs decides what the count means. With ``bytes_per_token = KVGeometry.bytes_per_token``
    (K+V of all layers and heads) the result is the number of tokens the whole batch may activate per step; pass
    ``B * bytes_per_token`` to get the share of each of ``B`` requests. The paper's example, 17 ms x 64 GB/s ->
    ~118 tokens per request, is that per-request share at B = 64 with a Qwen3-8B token counted as 144 kB (its
    144 KiB read as 144,000 bytes): 64e9 * 0.017 / (64 * 144e3) = 118.06. With the exact 147,456 bytes per token
    the same batch gets 115.3 tokens per request.
    """
    _check_real("c_token", "link_bytes_per_s", link_bytes_per_s)
    _check_real("c_token", "t_decode_s", t_decode_s, allow_zero=True)
    _check_real("c_token", "bytes_per_token", bytes_per_token)
    return link_bytes_per_s * t_decode_s / bytes_per_token
