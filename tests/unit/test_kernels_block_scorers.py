"""block_score_any and summary_moments (oasis_kernels.block_scorers) vs their torch references and oasis_core."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_core.block_scorers import SCORERS, build, score
from oasis_kernels.block_score import block_score
from oasis_kernels.block_scorers import (
    block_score_any,
    block_score_any_ref,
    summary_moments,
    summary_moments_ref,
    summary_update_any,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(scorer, B, Hkv, G, D, BS, Nmax, n_seats, seed):
    g = torch.Generator().manual_seed(seed)
    keys = (torch.randn(n_seats, Hkv, Nmax * BS, D, generator=g) + torch.randn(D, generator=g)).to(torch.bfloat16)
    a, b = build(keys.float(), BS, scorer)
    q = torch.randn(B, Hkv * G, D, generator=g).to(torch.bfloat16)
    n_blocks = torch.randint(1, Nmax + 1, (B,), generator=g, dtype=torch.int32)
    n_blocks[0] = Nmax
    cast = [x.to(torch.bfloat16).contiguous() for x in (a, b)]
    return [t.to(DEV) for t in (q, *cast, n_blocks)]


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize(
    "B,Hkv,G,D,BS,Nmax,exclude_local,seats",
    [(3, 2, 3, 16, 4, 37, True, False), (2, 1, 4, 32, 8, 70, False, True)],
)
def test_block_score_any_matches_reference_and_core(scorer, B, Hkv, G, D, BS, Nmax, exclude_local, seats):
    n_seats = B + 2 if seats else B
    q, a, b, nb = make_case(scorer, B, Hkv, G, D, BS, Nmax, n_seats, seed=Nmax + len(scorer))
    seat = torch.arange(B, dtype=torch.int32, device=DEV).flip(0) + (2 if seats else 0) if seats else None
    out = torch.full((B, Hkv, Nmax), float("nan"), device=DEV)
    block_score_any(q, a, b, nb, scorer, seat=seat, exclude_local=exclude_local, out=out, block_n=16)
    ref = block_score_any_ref(q, a, b, nb, scorer, seat=seat, exclude_local=exclude_local)
    assert not out.isnan().any()
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    fin = torch.isfinite(ref)
    assert fin.sum() > B * Hkv  # most entries are real scores, not masks
    torch.testing.assert_close(out[fin], ref[fin], atol=2e-2, rtol=2e-2)  # bf16 operands of the dots
    idx = seat.long().cpu() if seat is not None else torch.arange(B)
    core = score(q.double().cpu(), a[idx].double().cpu(), b[idx].double().cpu(), scorer)
    torch.testing.assert_close(ref[fin].double().cpu(), core[fin.cpu()], atol=1e-3, rtol=1e-4)
    limit = nb.long().cpu() - (1 if exclude_local else 0)
    assert torch.equal(
        torch.isfinite(out).any(1).cpu() | (torch.isinf(out) & (out > 0)).any(1).cpu(),
        torch.arange(Nmax)[None, :] < limit[:, None],
    )


def test_minmax_equals_the_original_kernel():
    q, a, b, nb = make_case("minmax", 2, 2, 2, 16, 4, 20, 2, seed=1)
    torch.testing.assert_close(block_score_any(q, a, b, nb, "minmax"), block_score(q, a, b, nb), atol=0, rtol=0)


@pytest.mark.parametrize("with_std", [False, True])
@pytest.mark.parametrize("BS,D,M", [(4, 16, 9), (16, 32, 5)])
def test_summary_moments_matches_reference_and_core(with_std, BS, D, M):
    g = torch.Generator().manual_seed(BS + M + with_std)
    n_src, n_rows, n_max = 12, 6, 8
    k_src = (3 * torch.randn(n_src, BS, D, generator=g) + 1).to(torch.bfloat16)
    src = torch.randint(0, n_src, (M,), generator=g, dtype=torch.int32)
    src[1] = -1  # skipped
    flat = torch.randperm(n_rows * n_max, generator=g)[:M]
    dst_row, dst_block = (flat // n_max).to(torch.int32), (flat % n_max).to(torch.int32)
    n_valid = torch.randint(1, BS + 1, (M,), generator=g, dtype=torch.int32)
    n_valid[2] = 0  # skipped
    a = torch.full((n_rows, n_max, D), float("nan"))
    b = a.clone()
    want_a, want_b = a.clone(), b.clone()
    summary_moments_ref(k_src, src, dst_row, dst_block, n_valid, want_a, want_b, with_std)
    args = [t.to(DEV) for t in (k_src, src, dst_row, dst_block, n_valid, a, b)]
    summary_moments(*args, with_std)
    got_a, got_b = args[5].cpu(), args[6].cpu()
    assert torch.equal(got_a.isnan(), want_a.isnan())
    assert want_a.isnan().sum() == (n_rows * n_max - (M - 2)) * D
    torch.testing.assert_close(got_a.nan_to_num(), want_a.nan_to_num(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_b.nan_to_num(), want_b.nan_to_num(), atol=1e-5, rtol=1e-5)
    # against oasis_core's build of the same valid tokens
    i = 0
    s, nv = int(src[i]), int(n_valid[i])
    ca, cb = build(k_src[s, :nv].float(), BS, "gauss" if with_std else "mean")
    torch.testing.assert_close(got_a[dst_row[i], dst_block[i]], ca[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_b[dst_row[i], dst_block[i]], cb[0], atol=1e-4, rtol=1e-4)


def test_summary_update_any_dispatches_minmax():
    k_src = torch.randn(3, 4, 16).to(DEV)
    items = [torch.tensor(x, dtype=torch.int32, device=DEV) for x in ([0, 2], [0, 1], [1, 0], [4, 3])]
    a, b = torch.zeros(2, 2, 16, device=DEV), torch.zeros(2, 2, 16, device=DEV)
    summary_update_any(k_src, *items, a, b, "minmax_sum")
    torch.testing.assert_close(a[0, 1], k_src[0].amin(0))
    torch.testing.assert_close(b[1, 0], k_src[2, :3].amax(0))
