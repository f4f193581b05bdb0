"""gemma_ops kernels (and fused_ops' Gemma flags) vs their references, the references vs oasis_exec.model.gemma3,
and a tiny Gemma3Decoder fused against plain torch."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_exec.model import gemma3
from oasis_exec.model.decoder import rope
from oasis_kernels.fused_ops import qk_norm_rope
from oasis_kernels.gemma_ops import (
    gelu_mul,
    gelu_mul_ref,
    norm1p,
    norm1p_ref,
    one_plus,
    post_norm_add,
    post_norm_add_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=1e-2)}


def _close(got, want, dtype):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    torch.testing.assert_close(got.cpu().float(), want.float(), **TOL[dtype])


def _data(n, h, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, h, generator=g) * 3).to(dtype)
    o = torch.randn(n, h, generator=g).to(dtype)
    w = (0.3 * torch.randn(h, generator=g)).to(dtype)
    w2 = (0.3 * torch.randn(h, generator=g)).to(dtype)
    return x, o, w, w2


def test_references_are_the_models():
    x, o, w, _ = _data(4, 48, torch.bfloat16, 0)
    assert torch.equal(norm1p_ref(x, w, 1e-6), gemma3.norm1p(x, w, 1e-6))
    gu = torch.cat([x, o], 1)
    g, u = gu.chunk(2, dim=-1)
    assert torch.equal(gelu_mul_ref(gu), torch.nn.functional.gelu(g, approximate="tanh") * u)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,H", [(1, 64), (5, 200)])
def test_norm1p_and_post_norm_add(dtype, N, H):
    x, o, w, w2 = _data(N, H, dtype, N * H)
    d = lambda t: t.to(DEV)  # noqa: E731
    got = norm1p(d(x), d(one_plus(w)), 1e-6)
    _close(got, norm1p_ref(x, w, 1e-6), dtype)
    s, h = post_norm_add(d(o), d(x), d(one_plus(w)), d(one_plus(w2)), 1e-6)
    s_ref, h_ref = post_norm_add_ref(o, x, w, w2, 1e-6)
    _close(s, s_ref, dtype)
    _close(h, h_ref, dtype)
    s2, none = post_norm_add(d(o), d(x), d(one_plus(w)), None, 1e-6)
    assert none is None and torch.equal(s2.cpu(), s.cpu())
    # strided rows and a 3-d input
    xs = torch.randn(N, 2, H, generator=torch.Generator().manual_seed(1)).to(dtype)
    _close(norm1p(d(xs)[:, 0], d(one_plus(w)), 1e-6), norm1p_ref(xs[:, 0], w, 1e-6), dtype)
    _close(norm1p(d(xs), d(one_plus(w)), 1e-6), norm1p_ref(xs, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_mul(dtype):
    g = torch.Generator().manual_seed(3)
    gu = (torch.randn(6, 2 * 300, generator=g) * 4).to(dtype)
    _close(gelu_mul(gu.to(DEV)), gelu_mul_ref(gu), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_scale", [1.0, 0.75])
def test_qk_norm_rope_gemma(dtype, q_scale):
    """fused_ops.qk_norm_rope with one_plus and q_scale = Gemma3Decoder.qkv's norm1p per head, RoPE, q scale."""
    hq, hk, d, n = 4, 1, 32, 5
    g = torch.Generator().manual_seed(11)
    y = (torch.randn(n, (hq + 2 * hk) * d, generator=g) * 2).to(dtype)
    qw, kw = (0.3 * torch.randn(d, generator=g)).to(dtype), (0.3 * torch.randn(d, generator=g)).to(dtype)
    pos = torch.tensor([0, 7, 511, 4095, 32767])
    q, k, v = qk_norm_rope(
        y.to(DEV), pos.to(DEV), hq, hk, d, one_plus(qw).to(DEV), one_plus(kw).to(DEV), 1e-6, 1e4,
        one_plus=True, q_scale=q_scale,
    )  # fmt: skip
    q_ref = rope(norm1p_ref(y[:, : hq * d].view(n, hq, d), qw, 1e-6), pos, 1e4)
    if q_scale != 1.0:
        q_ref = q_ref * q_scale
    k_ref = rope(norm1p_ref(y[:, hq * d : (hq + hk) * d].view(n, hk, d), kw, 1e-6), pos, 1e4)
    _close(q, q_ref, dtype)
    _close(k, k_ref, dtype)
    assert torch.equal(v.cpu(), y[:, (hq + hk) * d :].reshape(n, hk, d))


def test_fused_gemma_decoder_matches_plain():
    """A tiny random Gemma 3 (both layer kinds, a query scale) through Gemma3Decoder fused and plain: the same logits
    to fp32 rounding, over a prompt and with a cache."""
    from oasis_core.specs import ModelSpec, periodic_windows

    spec = ModelSpec(
        name="tiny-gemma", n_layers=3, n_q_heads=4, n_kv_heads=1, head_dim=32, hidden=64, mlp_hidden=96, vocab=97,
        max_context_tokens=256, qk_norm=True, rope_theta=1e6, tie_embeddings=True,
        layer_windows=periodic_windows(3, 8, period=3, full_at=2), sliding_rope_theta=1e4, family="gemma3",
    )  # fmt: skip
    w = gemma3.random_weights(spec, 5, torch.float32, DEV)
    arch = gemma3.Gemma3Arch(query_pre_attn_scalar=24)
    plain = gemma3.Gemma3Decoder(spec, arch, w, torch.float32, fused=False)
    fused = gemma3.Gemma3Decoder(spec, arch, w, torch.float32, fused=True)
    assert fused.fused and not plain.fused
    toks = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2)).to(DEV)
    torch.testing.assert_close(fused.forward(toks).cpu(), plain.forward(toks).cpu(), atol=2e-4, rtol=2e-4)
