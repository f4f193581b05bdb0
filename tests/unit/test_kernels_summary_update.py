"""summary_update vs its reference and vs oasis_core.scoring.build_summaries."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_core.scoring import build_summaries
from oasis_kernels.summary_update import summary_update, summary_update_local, summary_update_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("BS,D,M", [(4, 16, 9), (16, 32, 5)])
def test_summary_update_matches_reference(BS, D, M):
    g = torch.Generator().manual_seed(BS + M)
    n_src, n_rows, n_max = 12, 6, 8
    k_src = torch.randn(n_src, BS, D, generator=g).to(torch.bfloat16)
    src = torch.randint(0, n_src, (M,), generator=g, dtype=torch.int32)
    src[1] = -1  # skipped
    # distinct destinations so the order of writes cannot matter
    flat = torch.randperm(n_rows * n_max, generator=g)[:M]
    dst_row, dst_block = (flat // n_max).to(torch.int32), (flat % n_max).to(torch.int32)
    n_valid = torch.randint(1, BS + 1, (M,), generator=g, dtype=torch.int32)
    n_valid[2] = 0  # skipped
    kmin = torch.full((n_rows, n_max, D), float("nan"), dtype=torch.bfloat16)
    kmax = kmin.clone()
    want_min, want_max = kmin.clone(), kmax.clone()
    summary_update_ref(k_src, src, dst_row, dst_block, n_valid, want_min, want_max)
    args = [t.to(DEV) for t in (k_src, src, dst_row, dst_block, n_valid, kmin, kmax)]
    summary_update(*args)
    got_min, got_max = args[5].cpu(), args[6].cpu()
    assert torch.equal(got_min.isnan(), want_min.isnan())  # exactly the live items written
    assert torch.equal(got_min.nan_to_num(), want_min.nan_to_num())
    assert torch.equal(got_max.nan_to_num(), want_max.nan_to_num())
    assert want_min.isnan().sum() == (n_rows * n_max - (M - 2)) * D


def test_local_block_summary_equals_core_build_summaries():
    """Re-summarising each request's local block from the slot pool gives oasis_core's summary of the context."""
    g = torch.Generator().manual_seed(5)
    B, Hkv, D, BS, n_max = 3, 2, 16, 4, 6
    lens = [21, 8, 3]
    n_blocks = torch.tensor([-(-n // BS) for n in lens], dtype=torch.int32)
    keys = torch.randn(B, Hkv, n_max * BS, D, generator=g).to(torch.bfloat16)
    k_slots = torch.randn(B * Hkv + 4, BS, D, generator=g).to(torch.bfloat16)
    local_slot = torch.randperm(B * Hkv + 4, generator=g)[: B * Hkv].view(B, Hkv).to(torch.int32)
    local_len = torch.tensor([n - (int(nb) - 1) * BS for n, nb in zip(lens, n_blocks)], dtype=torch.int32)
    for b in range(B):
        for h in range(Hkv):
            lo = (int(n_blocks[b]) - 1) * BS
            k_slots[local_slot[b, h], : local_len[b]] = keys[b, h, lo : lens[b]]
    seat = torch.tensor([2, 0, 1], dtype=torch.int32)
    kmin = torch.full((3, Hkv, n_max, D), float("nan"), dtype=torch.bfloat16)
    kmax = kmin.clone()
    args = [t.to(DEV) for t in (k_slots, local_slot, local_len, n_blocks, kmin, kmax)]
    summary_update_local(*args, seat=seat.to(DEV))
    kmin, kmax = args[4].cpu(), args[5].cpu()
    for b in range(B):
        cmin, cmax = build_summaries(keys[b, :, : lens[b]], BS)  # [Hkv, n_blocks, D]
        last = int(n_blocks[b]) - 1
        assert torch.equal(kmin[seat[b], :, last], cmin[:, last])
        assert torch.equal(kmax[seat[b], :, last], cmax[:, last])
        assert kmin[seat[b], :, :last].isnan().all()  # nothing else touched


@pytest.mark.gpu
def test_summary_update_gpu_realistic():
    B, Hkv, D, BS, n_max = 32, 8, 128, 16, 1024
    keys = torch.randn(B * Hkv, BS, D, device="cuda", dtype=torch.bfloat16)
    kmin = torch.full((B * Hkv, n_max, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    kmax = kmin.clone()
    src = torch.arange(B * Hkv, device="cuda", dtype=torch.int32)
    blk = torch.randint(0, n_max, (B * Hkv,), device="cuda", dtype=torch.int32)
    nv = torch.full((B * Hkv,), BS, device="cuda", dtype=torch.int32)
    summary_update(keys, src, src, blk, nv, kmin, kmax)
    assert torch.equal(kmin[src.long(), blk.long()], keys.amin(1))
    assert torch.equal(kmax[src.long(), blk.long()], keys.amax(1))
