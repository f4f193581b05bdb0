"""block_score vs its torch reference and oasis_core.scoring.score_blocks."""

import math

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_core.scoring import build_summaries, score_blocks, topk_blocks
from oasis_kernels.block_score import block_score, block_score_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(B, Hkv, G, D, BS, Nmax, n_seats, seed, device=DEV):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(n_seats, Hkv, Nmax * BS, D, generator=g).to(torch.bfloat16)
    kmin, kmax = build_summaries(keys, BS)
    q = torch.randn(B, Hkv * G, D, generator=g).to(torch.bfloat16)
    n_blocks = torch.randint(1, Nmax + 1, (B,), generator=g, dtype=torch.int32)
    n_blocks[0] = Nmax
    return [t.to(device) for t in (q, kmin.contiguous(), kmax.contiguous(), n_blocks)]


@pytest.mark.parametrize(
    "B,Hkv,G,D,BS,Nmax,block_n,exclude_local",
    [
        (3, 2, 3, 16, 4, 37, 16, True),
        (2, 1, 4, 32, 8, 70, 32, False),
        (1, 4, 1, 16, 4, 5, 64, True),
    ],
)
def test_block_score_matches_reference_and_core(B, Hkv, G, D, BS, Nmax, block_n, exclude_local):
    q, kmin, kmax, nb = make_case(B, Hkv, G, D, BS, Nmax, B, seed=Nmax)
    out = torch.full((B, Hkv, Nmax), float("nan"), device=q.device)
    block_score(q, kmin, kmax, nb, exclude_local=exclude_local, out=out, block_n=block_n)
    ref = block_score_ref(q, kmin, kmax, nb, exclude_local=exclude_local)
    assert not out.isnan().any()
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    fin = torch.isfinite(ref)
    torch.testing.assert_close(out[fin], ref[fin], atol=1e-3, rtol=1e-4)
    core = score_blocks(q.double().cpu(), kmin.double().cpu(), kmax.double().cpu())  # [B, Hkv, Nmax]
    torch.testing.assert_close(out[fin].double().cpu(), core[fin.cpu()], atol=1e-3, rtol=1e-4)
    # the masked blocks are exactly those topk_blocks refuses
    limit = nb.long() - (1 if exclude_local else 0)
    assert torch.equal(fin.any(1).cpu(), (torch.arange(Nmax)[None, :] < limit.cpu()[:, None]))


def test_block_score_with_seats_and_topk():
    """Requests read their summary seat; torch.topk on the scores picks what oasis_core's topk_blocks picks."""
    B, Hkv, G, D, BS, Nmax = 3, 2, 2, 16, 4, 12
    q, kmin, kmax, _ = make_case(B, Hkv, G, D, BS, Nmax, n_seats=5, seed=3)
    seat = torch.tensor([4, 0, 2], dtype=torch.int32, device=q.device)
    nb = torch.tensor([12, 9, 2], dtype=torch.int32, device=q.device)
    out = torch.full((B, Hkv, Nmax), float("nan"), device=q.device)
    block_score(q, kmin, kmax, nb, seat=seat, out=out, block_n=16)
    core = score_blocks(q.double().cpu(), kmin[seat.long()].double().cpu(), kmax[seat.long()].double().cpu())
    ids = topk_blocks(core.reshape(B * Hkv, Nmax), 3, nb.long().cpu().repeat_interleave(Hkv))
    vals, mine = out.reshape(B * Hkv, Nmax).topk(3, dim=1)
    mine = torch.where(torch.isinf(vals), -1, mine)
    assert torch.equal(mine.cpu(), ids)
    assert (ids[4:] == -1).sum() == 2 * 2  # request 2 has one eligible block (block 0) of 2


@pytest.mark.gpu
def test_block_score_gpu_realistic():
    B, Hkv, G, D, BS, Nmax = 16, 8, 4, 128, 16, 1024
    q, kmin, kmax, nb = make_case(B, Hkv, G, D, BS, Nmax, B, seed=0)
    out = block_score(q, kmin, kmax, nb)
    ref = block_score_ref(q, kmin, kmax, nb)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out))
    torch.testing.assert_close(out[fin], ref[fin], atol=1e-2, rtol=1e-4)
    assert math.isinf(out[0, 0, Nmax - 1].item())
