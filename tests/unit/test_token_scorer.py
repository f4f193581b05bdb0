"""oasis_core.token_scorer: numpy == torch == the definition (float64, token by token), masks, the sink, bytes."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oasis_core import token_scorer as ts

torch = pytest.importorskip("torch")


def brute(q, keys, basis, bs, n_tokens, scale, sink):
    """Block mass estimates per query head from the keys themselves, normalised per head, summed over the group."""
    b, hq, d = q.shape
    hkv, t = keys.shape[1], keys.shape[2]
    g = hq // hkv
    n = -(-t // bs)
    out = np.full((b, hkv, n), -math.inf)
    for bi in range(b):
        nt = int(n_tokens[bi])
        for h in range(hkv):
            bas = basis[h].astype(np.float64)
            mass = np.zeros((g, n))
            for gi in range(g):
                qq = q[bi, h * g + gi].astype(np.float64) @ bas
                for tok in range(min(t, nt)):
                    mass[gi, tok // bs] += math.exp(scale * float(qq @ (keys[bi, h, tok].astype(np.float64) @ bas)))
                mass[gi] /= mass[gi].sum() if mass[gi].sum() > 0 else 1.0
            for j in range(n):
                if j * bs < nt:
                    out[bi, h, j] = math.log(mass[:, j].sum()) if mass[:, j].sum() > 0 else -math.inf
            if sink and nt > 0:
                out[bi, h, 0] = math.inf
    return out


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2),
    hkv=st.integers(1, 3),
    g=st.integers(1, 3),
    t=st.integers(1, 40),
    bs=st.sampled_from([1, 4, 16]),
    r=st.integers(1, 8),
    onehot=st.booleans(),
    sink=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_numpy_equals_torch_and_the_definition(b, hkv, g, t, bs, r, onehot, sink, seed):
    rng = np.random.default_rng(seed)
    d = 8
    keys = (rng.standard_normal((b, hkv, t, d)) * rng.uniform(0.5, 3, d)).astype(np.float32)
    q = rng.standard_normal((b, hkv * g, d)).astype(np.float32)
    if onehot:
        basis = ts.channel_basis(np.stack([rng.choice(d, r, replace=False) for _ in range(hkv)]), d, np.float32)
    else:
        basis = np.linalg.qr(rng.standard_normal((hkv, d, d)))[0][..., :r].astype(np.float32)
    n_tokens = rng.integers(0, t + 1, b)
    kp = ts.build(keys, basis, bs)
    s_np = ts.score(q, kp, basis, n_tokens, sink=sink)
    kpt = ts.build(torch.tensor(keys), torch.tensor(basis), bs)
    s_t = ts.score(torch.tensor(q), kpt, torch.tensor(basis), torch.tensor(n_tokens), sink=sink)
    assert kp.shape == (b, hkv, -(-t // bs), bs, r)
    np.testing.assert_allclose(kpt.numpy(), kp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_t.numpy(), s_np, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s_np, brute(q, keys, basis, bs, n_tokens, 1 / math.sqrt(d), sink), rtol=1e-4, atol=1e-3)


def test_full_basis_ranks_blocks_by_their_true_attention_mass():
    """With every channel kept, the score is the log of the group's summed softmax mass per block: exact."""
    rng = np.random.default_rng(5)
    d, t, bs, g = 8, 64, 4, 3
    keys = rng.standard_normal((1, 1, t, d)).astype(np.float32) * 2
    q = rng.standard_normal((1, g, d)).astype(np.float32) * 2
    basis = ts.channel_basis(np.arange(d)[None], d, np.float32)
    s = ts.score(q, ts.build(keys, basis, bs), basis, np.array([t]), sink=False)[0, 0]
    p = np.exp(q[0] @ keys[0, 0].T / math.sqrt(d))
    p /= p.sum(-1, keepdims=True)  # [G, T]
    np.testing.assert_allclose(np.exp(s), p.reshape(g, t // bs, bs).sum((0, 2)), rtol=1e-4)


def test_heads_are_normalised_before_the_group_sum():
    """Head 0 is peaked on block 0 (a huge logit), head 1 wants block 1 with nearly all of its mass; pooling raw
    log-masses picks block 0 for the group twice over, the normalised sum sees that block 1 holds about half of the
    group's attention against block 2's near nothing."""
    d = 2
    keys = np.array([[[[9.0, 0.0], [0.0, 3.0], [0.0, -3.0]]]], np.float32)  # blocks of 1 token
    q = np.array([[[9.0, 0.0], [0.0, 3.0]]], np.float32)
    basis = ts.channel_basis(np.arange(d)[None], d, np.float32)
    s = ts.score(q, ts.build(keys, basis, 1), basis, np.array([3]), scale=1.0, sink=False)[0, 0]
    assert s[1] > math.log(0.45) and s[2] < math.log(0.01)


def test_past_tokens_do_not_count_and_sink():
    keys = np.ones((1, 1, 10, 4), np.float32)
    q = np.ones((1, 1, 4), np.float32)
    basis = ts.channel_basis(np.array([[0, 2]]), 4, np.float32)
    s = ts.score(q, ts.build(keys, basis, 4), basis, np.array([5]))
    assert s[0, 0, 0] == math.inf and np.isfinite(s[0, 0, 1]) and s[0, 0, 2] == -math.inf
    np.testing.assert_array_equal(ts.score(q, ts.build(keys, basis, 4), basis, np.array([0]))[0, 0], -math.inf)
    assert ts.bytes_per_token(64) == 128  # Gemma (D = 256): twice min/max's 2 * 256 * 2 / 16


def test_engine_rank_and_geometry_bytes():
    from oasis_core.geometry import KVGeometry
    from oasis_core.specs import get_model

    assert ts.engine_rank(128) == 32 and ts.engine_rank(128, 16) == 16
    with pytest.raises(ValueError, match="token_rank"):
        ts.engine_rank(128, 3)
    assert ts.geometry_rank("minmax", 128, 16) == 0 and ts.geometry_rank("tokens", 128) == 32
    m = get_model("qwen3-8b")
    two, tok = KVGeometry(m, 16), KVGeometry(m, 16, token_rank=32)
    assert tok.summary_bytes_per_block_head == 2 * two.summary_bytes_per_block_head == 16 * 32 * 2
    assert tok.summary_bytes(16384) == 2 * two.summary_bytes(16384)
