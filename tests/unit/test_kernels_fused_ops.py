"""fused_ops kernels vs their references (and the references vs oasis_exec.model.decoder), and a fused tiny Decoder."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_exec.model import decoder as model
from oasis_kernels.fused_ops import (
    add_rms_norm,
    add_rms_norm_ref,
    qk_norm_rope,
    qk_norm_rope_ref,
    rms_norm,
    rms_norm_ref,
    rope_ref,
    silu_mul,
    silu_mul_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}


def _close(got, want, dtype, **kw):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu().float(), want.cpu().float(), **(kw or TOL[dtype]))


def test_references_are_the_model_ops():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 2, 16, generator=g).to(torch.bfloat16)
    w = torch.randn(16, generator=g).to(torch.bfloat16)
    pos = torch.randint(0, 40000, (3, 5), generator=g)
    assert torch.equal(rms_norm_ref(x, w, 1e-6), model.rms_norm(x, w, 1e-6))
    assert torch.equal(rope_ref(x, pos, 1e6), model.rope(x, pos, 1e6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,H", [(1, 64), (5, 200)])
def test_rms_norm_and_add(dtype, N, H):
    g = torch.Generator().manual_seed(N * H)
    x = (torch.randn(N, H, generator=g) * 3).to(dtype)
    r = torch.randn(N, H, generator=g).to(dtype)
    w = (torch.randn(H, generator=g) * 0.5 + 1).to(dtype)
    xd, rd, wd = x.to(DEV), r.to(DEV), w.to(DEV)
    _close(rms_norm(xd, wd, 1e-6), rms_norm_ref(x, w, 1e-6), dtype)
    s, n = add_rms_norm(xd, rd, wd, 1e-5)
    s_ref, n_ref = add_rms_norm_ref(x, r, w, 1e-5)
    assert torch.equal(s.cpu(), s_ref)  # one rounded add, as torch
    _close(n, n_ref, dtype)
    # strided rows (the runner's x.view(B, nq, -1)[:, 0]) and a 3-d input
    xs = torch.randn(N, 2, H, generator=g).to(dtype)
    _close(rms_norm(xs.to(DEV)[:, 0], wd, 1e-6), rms_norm_ref(xs[:, 0], w, 1e-6), dtype)
    _close(rms_norm(xs.to(DEV), wd, 1e-6), rms_norm_ref(xs, w, 1e-6), dtype)


POS = [0, 1, 2, 17, 1000, 4095, 29999, 30000, 32767, 40959, 131071, 199999]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "hq,hk,d,norm,theta",
    [(4, 2, 16, True, 1e4), (2, 2, 64, False, 1e4), (4, 1, 128, True, 1e6), (3, 1, 32, False, 5e5)],
)
def test_qk_norm_rope(dtype, hq, hk, d, norm, theta):
    g = torch.Generator().manual_seed(hq * d + norm)
    N = 6
    y = torch.randn(N, (hq + 2 * hk) * d, generator=g).to(dtype)
    pos = torch.tensor(POS, dtype=torch.int64)[torch.randperm(len(POS), generator=g)[:N]]
    pos[0] = 30000  # always one large position
    qw = (torch.randn(d, generator=g) * 0.5 + 1).to(dtype) if norm else None
    kw = (torch.randn(d, generator=g) * 0.5 + 1).to(dtype) if norm else None
    dv = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    q, k, v = qk_norm_rope(y.to(DEV), pos.to(DEV), hq, hk, d, dv(qw), dv(kw), 1e-6, theta)
    # the reference on the kernel's device: rope's inv_freq comes from torch there (CUDA's pow and the CPU's differ
    # in the last bit, ~1e-3 rad of angle at position 2e5)
    q_ref, k_ref, v_ref = qk_norm_rope_ref(y.to(DEV), pos.to(DEV), hq, hk, d, dv(qw), dv(kw), 1e-6, theta)
    _close(q, q_ref, dtype)
    _close(k, k_ref, dtype)
    assert torch.equal(v.cpu(), v_ref.cpu()) and v.is_contiguous()
    assert q.shape == (N, hq, d) and k.shape == (N, hk, d) and q.is_contiguous() and k.is_contiguous()


def test_rope_large_positions_fp32():
    """Angles up to 2e5 rad: tl.cos/tl.sin stay within ~1 ulp of torch's (bit-identical on the H200)."""
    d, hq, hk = 128, 1, 1
    pos = torch.tensor(POS, dtype=torch.int64)
    y = torch.randn(len(POS), (hq + 2 * hk) * d, generator=torch.Generator().manual_seed(1))
    q, k, _ = qk_norm_rope(y.to(DEV), pos.to(DEV), hq, hk, d, theta=1e6)
    q_ref, k_ref, _ = qk_norm_rope_ref(y.to(DEV), pos.to(DEV), hq, hk, d, theta=1e6)  # on the kernel's device
    err = max((q - q_ref).abs().max().item(), (k - k_ref).abs().max().item())
    assert err < 1e-5, err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,m", [(1, 64), (3, 1500)])
def test_silu_mul(dtype, N, m):
    g = torch.Generator().manual_seed(m)
    gu = (torch.randn(N, 2 * m, generator=g) * 4).to(dtype)
    _close(silu_mul(gu.to(DEV)), silu_mul_ref(gu), dtype)
    wide = torch.randn(N, 3 * m, generator=g).to(dtype)[:, : 2 * m]  # strided rows
    _close(silu_mul(wide.to(DEV)), silu_mul_ref(wide), dtype)


@pytest.mark.parametrize("dtype,qk_norm", [(torch.float32, True), (torch.bfloat16, True), (torch.bfloat16, False)])
def test_decoder_fused_matches_plain(dtype, qk_norm):
    import dataclasses

    from oasis_core.specs import get_model

    shape = dataclasses.replace(get_model("tiny"), qk_norm=qk_norm)  # GQA: 4 q heads, 2 KV heads
    w = model.random_weights(shape, seed=4, dtype=dtype)
    for k in list(w):  # non-trivial norm weights
        if k.endswith("norm.weight") or k.endswith("layernorm.weight"):
            w[k] = (torch.rand(w[k].shape, generator=torch.Generator().manual_seed(len(k))) + 0.5).to(dtype)
    w = {k: v.to(DEV) for k, v in w.items()}  # on a GPU machine the kernels are compiled: CUDA tensors
    plain = model.Decoder(shape, w, dtype)
    fused = model.Decoder(shape, w, dtype, fused=True)
    assert fused.fused and not plain.fused
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, shape.hidden, generator=g).to(dtype).to(DEV)
    pos = torch.tensor([0, 5, 4000, 30000], device=DEV)
    attn = torch.randn(4, shape.n_q_heads, shape.head_dim, generator=g).to(dtype).to(DEV)
    for layer in range(shape.n_layers):
        for a, b in zip(fused.qkv(layer, x, pos), plain.qkv(layer, x, pos)):
            _close(a, b, dtype)
        _close(fused.finish(layer, x, attn), plain.finish(layer, x, attn), dtype)
    _close(fused.logits(x), plain.logits(x), dtype, atol=1e-4 if dtype == torch.float32 else 5e-2, rtol=1e-2)


@pytest.mark.gpu
def test_fused_ops_gpu_realistic():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    N, hidden, hq, hk, d, m = 64, 4096, 32, 8, 128, 12288
    x = torch.randn(N, hidden, device=dev, dtype=dt)
    r = torch.randn_like(x)
    w = torch.rand(hidden, device=dev, dtype=dt) + 0.5
    _close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6).cpu(), dt)
    s, n = add_rms_norm(x, r, w, 1e-6)
    s_ref, n_ref = add_rms_norm_ref(x, r, w, 1e-6)
    assert torch.equal(s, s_ref)
    _close(n, n_ref.cpu(), dt)
    y = torch.randn(N, (hq + 2 * hk) * d, device=dev, dtype=dt)
    pos = torch.randint(0, 40960, (N,), device=dev)
    qw, kw = torch.rand(d, device=dev, dtype=dt) + 0.5, torch.rand(d, device=dev, dtype=dt) + 0.5
    for norm in (True, False):
        a = (qw, kw) if norm else (None, None)
        got = qk_norm_rope(y, pos, hq, hk, d, *a, 1e-6, 1e6)
        want = qk_norm_rope_ref(y, pos, hq, hk, d, *a, 1e-6, 1e6)
        for t, u in zip(got, want):
            _close(t, u.cpu(), dt)
    yf = torch.randn(N, (hq + 2 * hk) * d, device=dev)
    posf = torch.tensor(POS * 6, device=dev)[:N]
    for t, u in zip(
        qk_norm_rope(yf, posf, hq, hk, d, qw.float(), kw.float(), 1e-6, 1e6),
        qk_norm_rope_ref(yf, posf, hq, hk, d, qw.float(), kw.float(), 1e-6, 1e6),
    ):
        _close(t, u.cpu(), torch.float32)
    gu = torch.randn(N, 2 * m, device=dev, dtype=dt) * 4
    _close(silu_mul(gu), silu_mul_ref(gu).cpu(), dt)
