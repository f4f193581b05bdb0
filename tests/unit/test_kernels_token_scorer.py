"""oasis_kernels.token_scorer: the kernels (Triton interpreter without CUDA) against the plain-torch references, the
references against oasis_core.token_scorer and the definition."""

import math

import numpy as np
import pytest

from oasis_core import token_scorer as core

torch = pytest.importorskip("torch")
import oasis_kernels  # noqa: E402, F401  (Triton interpreter without CUDA)
from oasis_kernels.token_scorer import (  # noqa: E402
    project_keys,
    token_score,
    token_score_ref,
    token_update,
    token_update_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(B, Hkv, G, D, R, BS, Nmax, n_seats, seed):
    g = torch.Generator().manual_seed(seed)
    chan = torch.stack([torch.randperm(D, generator=g)[:R] for _ in range(Hkv)]).to(torch.int32)
    kp = (torch.randn(n_seats, Hkv, Nmax, BS, R, generator=g) * 2 + 0.3).to(torch.bfloat16)
    q = (torch.randn(B, Hkv * G, D, generator=g) * 2).to(torch.bfloat16)
    nb = torch.randint(1, Nmax + 1, (B,), generator=g, dtype=torch.int32)
    nb[0] = Nmax
    return [t.to(DEV) for t in (q, kp, chan, nb)]


@pytest.mark.parametrize(
    "B,Hkv,G,D,R,BS,Nmax,exclude_local,seats,sink",
    [
        (3, 2, 3, 32, 8, 4, 37, True, False, True),
        (2, 1, 4, 64, 16, 16, 21, False, True, True),
        (2, 2, 1, 16, 4, 8, 40, True, True, False),
        (1, 1, 16, 16, 4, 4, 300, True, False, True),  # G = 16: the norm pass's tile is 16 x 256, two iterations
    ],
)
def test_token_score_matches_reference(B, Hkv, G, D, R, BS, Nmax, exclude_local, seats, sink):
    n_seats = B + 2 if seats else B
    q, kp, chan, nb = make_case(B, Hkv, G, D, R, BS, Nmax, n_seats, seed=Nmax + D)
    seat = (torch.arange(B, dtype=torch.int32, device=DEV).flip(0) + 2) if seats else None
    out = torch.full((B, Hkv, Nmax), float("nan"), device=DEV)  # poisoned: every entry must be written
    token_score(q, kp, chan, nb, seat=seat, exclude_local=exclude_local, sink=sink, out=out, block_n=4)
    ref = token_score_ref(q, kp, chan, nb, seat=seat, exclude_local=exclude_local, sink=sink)
    assert not out.isnan().any()
    assert torch.equal(torch.isinf(out) & (out > 0), torch.isinf(ref) & (ref > 0))
    assert torch.equal(torch.isinf(out) & (out < 0), torch.isinf(ref) & (ref < 0))
    fin = torch.isfinite(ref)
    assert fin.sum() > B * Hkv  # most entries are real scores, not masks
    torch.testing.assert_close(out[fin], ref[fin], atol=2e-3, rtol=2e-3)
    # the same ranking of every row's blocks (the masked ones tie alike in both: a stable sort keeps their order)
    order = [torch.sort(x.nan_to_num(0, 1e9, -1e9), dim=-1, stable=True).indices for x in (out, ref)]
    assert torch.equal(order[0], order[1])


def test_token_score_ranks_as_the_definition():
    """Float64 definition of one row, token by token: per query head the softmax mass of each block's tokens."""
    q, kp, chan, nb = make_case(1, 1, 3, 16, 4, 4, 9, 1, seed=5)
    nb[0] = 9
    out = token_score(q, kp, chan, nb, sink=False, block_n=2)[0, 0].cpu().double()
    qd, kd = q.cpu().double()[0], kp.cpu().double()[0, 0]  # [3, 16], [9, 4, 4]
    qc = qd[:, chan[0].long().cpu()]  # [3, 4]
    logits = torch.einsum("gr,ntr->gnt", qc, kd[:8]) / 4.0  # the 8 eligible blocks (block 8: the local one)
    mass = torch.softmax(logits.reshape(3, -1), -1).reshape(3, 8, 4).sum(-1)  # [G, N]
    want = torch.log(mass.sum(0))
    torch.testing.assert_close(out[:8], want, atol=1e-3, rtol=1e-3)
    assert out[8] == -math.inf


@pytest.mark.parametrize("BS,R,D", [(4, 4, 16), (16, 16, 64)])
def test_token_update_matches_reference(BS, R, D):
    g = torch.Generator().manual_seed(BS + R)
    Hkv, n_seats, Nmax, n_src = 2, 3, 5, 7
    k_src = torch.randn(n_src, BS, D, generator=g).to(torch.bfloat16).to(DEV)
    chan = torch.stack([torch.randperm(D, generator=g)[:R] for _ in range(Hkv)]).to(torch.int32).to(DEV)
    src = torch.tensor([3, -1, 0, 6, 2], dtype=torch.int32, device=DEV)
    row = torch.tensor([1, 0, 4, 5, 2], dtype=torch.int32, device=DEV)
    blk = torch.tensor([0, 4, 3, 4, 1], dtype=torch.int32, device=DEV)
    nv = torch.tensor([BS, 2, 1, BS - 1, 0], dtype=torch.int32, device=DEV)
    poison = torch.full((n_seats, Hkv, Nmax, BS, R), 7.0, dtype=torch.bfloat16, device=DEV)
    got, want = poison.clone(), poison.clone()
    token_update(k_src, src, row, blk, nv, got, chan)
    token_update_ref(k_src, src, row, blk, nv, want, chan)
    assert torch.equal(got, want)
    # item 0: row 1 = (seat 0, head 1), block 0: the source block's channels of head 1
    assert torch.equal(got[0, 1, 0], k_src[3][:, chan[1].long()])
    assert torch.equal(got[2, 0, 3, 1:], torch.zeros_like(got[2, 0, 3, 1:]))  # past n_valid: zeros
    assert (got[0, 0, 4] == 7).all() and (got[1, 0, 1] == 7).all()  # src -1 and n_valid 0: untouched


def test_reference_matches_core_per_seat():
    """Each row of the engine reference is core's score of that seat's own keys (one-hot basis of the channels)."""
    rng = np.random.default_rng(1)
    hkv, g, d, r, bs, nmax = 2, 3, 16, 4, 4, 6
    chan = np.stack([rng.choice(d, r, replace=False) for _ in range(hkv)]).astype(np.int32)
    basis = core.channel_basis(chan, d, np.float32)
    keys = rng.standard_normal((4, nmax * bs, hkv, d)).astype(np.float32)  # per seat, token-major as appended
    kp = torch.stack([project_keys(torch.tensor(k), torch.tensor(chan)) for k in keys])  # [4, T, Hkv, r]
    kp = kp.view(4, nmax, bs, hkv, r).permute(0, 3, 1, 2, 4).contiguous()  # [seats, Hkv, Nmax, bs, r]
    seat = torch.tensor([2, 0, 3])
    n_blocks = torch.tensor([4, 6, 1])
    q = torch.tensor(rng.standard_normal((3, hkv * g, d)).astype(np.float32))
    out = token_score_ref(q, kp, torch.tensor(chan), n_blocks, seat)
    for i, (s, n) in enumerate(zip(seat.tolist(), n_blocks.tolist())):
        elig = n - 1
        want = core.score(
            q[i : i + 1].numpy(), core.build(keys[s].transpose(1, 0, 2), basis, bs)[None], basis, np.array([elig * bs])
        )[0]
        got = out[i].numpy()
        np.testing.assert_allclose(got[:, :elig], want[:, :elig], rtol=1e-5, atol=1e-5)
        assert np.all(got[:, elig:] == -math.inf)
    assert out[0, :, 0].eq(math.inf).all()  # the sink


def test_projection_is_the_channel_gather():
    k = torch.randn(5, 2, 8)
    chan = torch.tensor([[1, 5, 0], [7, 2, 3]])
    torch.testing.assert_close(project_keys(k, chan), torch.stack([k[:, h][:, chan[h]] for h in range(2)], 1))
    assert core.first_pairs(2, 8, 4).tolist() == [[0, 1, 4, 5], [0, 1, 4, 5]]
