"""oasis_kernels.token_scorer: the engine-layout reference against oasis_core.token_scorer and the definition."""

import math

import numpy as np
import pytest

from oasis_core import token_scorer as core

torch = pytest.importorskip("torch")
from oasis_kernels.token_scorer import project_keys, token_score  # noqa: E402


@pytest.mark.parametrize("exclude_local", [True, False])
def test_seats_lengths_and_masks_match_core(exclude_local):
    """Three requests on seats 2, 0, 3 of a 4-seat store, different lengths (one mid-block, one empty): each row is
    core's score of that request's own keys, -inf past its eligible blocks."""
    rng = np.random.default_rng(1)
    hkv, g, d, r, bs, nmax = 2, 3, 16, 4, 4, 6
    basis = core.channel_basis(np.stack([rng.choice(d, r, replace=False) for _ in range(hkv)]), d, np.float32)
    keys = rng.standard_normal((4, nmax * bs, hkv, d)).astype(np.float32)  # per seat, token-major as appended
    kp = torch.stack([project_keys(torch.tensor(k), torch.tensor(basis)) for k in keys])  # [4, T, Hkv, r]
    kp = kp.view(4, nmax, bs, hkv, r).permute(0, 3, 1, 2, 4).contiguous()  # [seats, Hkv, Nmax, bs, r]
    seat = torch.tensor([2, 0, 3])
    n_tokens = torch.tensor([13, 24, 0])
    q = torch.tensor(rng.standard_normal((3, hkv * g, d)).astype(np.float32))
    out = token_score(q, kp, torch.tensor(basis), n_tokens, seat, exclude_local=exclude_local)
    for i, (s, n) in enumerate(zip(seat.tolist(), n_tokens.tolist())):
        want = core.score(
            q[i : i + 1].numpy(), core.build(keys[s].transpose(1, 0, 2), basis, bs)[None], basis, np.array([n])
        )[0]
        elig = max(-(-n // bs) - (1 if exclude_local else 0), 0)
        got = out[i].numpy()
        np.testing.assert_allclose(got[:, :elig], want[:, :elig], rtol=1e-5, atol=1e-5)
        assert np.all(got[:, elig:] == -math.inf)
    assert out[0, :, 0].eq(math.inf).all()  # the sink


def test_projection_is_the_basis_product():
    k = torch.randn(5, 2, 8)
    basis = torch.randn(2, 8, 3)
    torch.testing.assert_close(project_keys(k, basis), torch.stack([k[:, h] @ basis[h] for h in range(2)], 1))
