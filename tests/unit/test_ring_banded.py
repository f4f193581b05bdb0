"""A sliding layer's prefill chunk longer than its window attends in query tiles (``kv.ring._banded``): equal to the
plain masked attention over every key of the chunk and the ring's earlier tokens, on random inputs."""

import pytest
import torch

from oasis_exec.kv.ring import _attn, _banded


@pytest.mark.parametrize("W", [1, 3, 8, 40])
@pytest.mark.parametrize("n", [9, 41, 129])
@pytest.mark.parametrize("n_old_gap", [0, 1, 7])  # n_old = W - 1 - gap (clipped at 0): a ring full or not yet
@pytest.mark.parametrize("H,G", [(1, 4), (2, 1), (2, 3)])
def test_banded_equals_the_masked_attention(W, n, n_old_gap, H, G):
    if n <= W:
        pytest.skip("a chunk within the window takes the plain path")
    n_old = max(W - 1 - n_old_gap, 0)
    g = torch.Generator().manual_seed(W * 1000 + n * 10 + n_old)
    D, start = 16, 5000 + n_old
    q = torch.randn(n, H * G, D, generator=g)
    keys = torch.randn(H, n_old + n, D, generator=g)
    vals = torch.randn(H, n_old + n, D, generator=g)
    kpos = torch.arange(start - n_old, start + n)
    qpos = torch.arange(start, start + n)
    valid = (kpos[None] <= qpos[:, None]) & (kpos[None] > qpos[:, None] - W)
    ref = _attn(q[None], keys[None], vals[None], valid[None])[0]
    got = _banded(q, keys, vals, n_old, W)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_banded_ignores_keys_outside_the_window():
    """Poisoned keys/values just outside every query's window change nothing (a mask off by one would see them)."""
    W, n, n_old, D = 4, 12, 3, 8
    g = torch.Generator().manual_seed(1)
    q = torch.randn(n, 2, D, generator=g)
    keys, vals = torch.randn(1, n_old + n, D, generator=g), torch.randn(1, n_old + n, D, generator=g)
    base = _banded(q, keys, vals, n_old, W)
    for i in range(n):  # query i (index n_old + i in keys) sees keys n_old + i - W + 1 .. n_old + i
        k2, v2 = keys.clone(), vals.clone()
        out_of_window = [j for j in range(n_old + n) if not (n_old + i - W < j <= n_old + i)]
        k2[:, out_of_window] = 1e4
        v2[:, out_of_window] = 1e4  # finite: a masked weight is 0, and 0 x NaN would be NaN on any dense path
        torch.testing.assert_close(_banded(q, k2, v2, n_old, W)[i], base[i])
