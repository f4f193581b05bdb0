"""attend_slots (the K slots a victim-cache row attends, one launch) vs its reference, oasis_core.selection's."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_kernels.attend_slots import attend_slots, attend_slots_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def tables(g, N, S, span):
    res = torch.full((N, S), -1, dtype=torch.int64)
    for i in range(N):
        n = int(torch.randint(0, S + 1, (1,), generator=g))  # 0 .. S blocks, empty slots anywhere
        res[i, torch.randperm(S, generator=g)[:n]] = torch.randperm(4 * S, generator=g)[:n]
    ls = torch.randint(-span, 1, (N, S), generator=g)  # a small span: many ties, broken by the slot
    return res, ls


@pytest.mark.parametrize("S,K,span", [(24, 8, 3), (20, 20, 2), (17, 5, 40), (9, 1, 0)])
def test_matches_reference(S, K, span):
    g = torch.Generator().manual_seed(S * 100 + K)
    N, W = 14, S + 2
    res, ls = tables(g, N, S, span)
    ls[0, :3] = -(2**50)  # below the kernel's floor: ties there, as in the reference (which clamps the same)
    rows = torch.randperm(N, generator=g)[:11]
    res, ls, rows = res.to(DEV), ls.to(DEV), rows.to(DEV)
    got = attend_slots(res, ls, rows, K, W)
    want = attend_slots_ref(res, ls, rows, K, W)
    assert torch.equal(got, want)
    # the listed slots are each row's own, resident, in ascending order, -1 only at the end
    for r, row in enumerate(rows.tolist()):
        ids = got[r][got[r] >= 0].long() - row * W
        assert ids.tolist() == sorted(ids.tolist()) and bool((res[row, ids] >= 0).all())
        assert int((got[r] >= 0).sum()) == min(K, int((res[row] >= 0).sum()))


def test_every_resident_slot_when_k_is_s():
    g = torch.Generator().manual_seed(7)
    res, ls = tables(g, 6, 12, 5)
    rows = torch.arange(6)
    got = attend_slots(res.to(DEV), ls.to(DEV), rows.to(DEV), 12, 12).cpu()
    for r in range(6):
        held = [r * 12 + s for s in range(12) if res[r, s] >= 0]
        assert got[r].tolist() == held + [-1] * (12 - len(held))


def test_rows_whose_newest_selection_is_exactly_k_take_the_short_path():
    """After a plan that found every predicted block: exactly K slots hold the newest last_sel (the kernel takes them
    without its search); mixed with rows that need the search (fewer or more such slots)."""
    g = torch.Generator().manual_seed(3)
    N, S, K, W = 10, 30, 8, 32
    res, _ = tables(g, N, S, 0)
    res[:6] = torch.stack([torch.randperm(200, generator=g)[:S] for _ in range(6)])  # full rows
    ls = -torch.randint(1, 9, (N, S), generator=g)
    for i in range(N):
        n_new = K if i < 6 else (K - 3, K + 3, 0, K)[i - 6]
        ls[i, torch.randperm(S, generator=g)[:n_new]] = 0
    rows = torch.arange(N)
    got = attend_slots(res.to(DEV), ls.to(DEV), rows.to(DEV), K, W).cpu()
    assert torch.equal(got, attend_slots_ref(res, ls, rows, K, W))
    for i in range(6):
        assert got[i].tolist() == [i * W + s for s in range(S) if ls[i, s] == 0]
