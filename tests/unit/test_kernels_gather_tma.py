"""The experimental TMA gather (oasis_kernels.gather_tma) against the reference copy, -1 padding included."""

import pytest
import torch
from gather_cases import DEV, make_pool, random_list

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_kernels.gather import gather_ref
from oasis_kernels.gather_tma import tma_gather


@pytest.mark.parametrize("n_programs,stages", [(3, 2), (1, 1), (32, 3)])
def test_tma_gather_matches_reference(n_programs, stages):
    n_host, Hkv, BS, D, n_slots, C = 7, 2, 16, 32, 20, 13  # an item: 16 x 32 bf16 = 1 KiB = 8 rows of 128 bytes
    host_k, host_v, k_slots, v_slots = make_pool(n_host, Hkv, BS, D, n_slots, seed=n_programs, pin=DEV == "cuda")
    sb, sh, ds = random_list(C, n_host, Hkv, n_slots, torch.Generator().manual_seed(stages))
    want_k, want_v = k_slots.cpu().clone(), v_slots.cpu().clone()
    gather_ref(host_k, host_v, sb, sh, ds, want_k, want_v)
    tma_gather(
        host_k, host_v, sb.to(DEV), sh.to(DEV), ds.to(DEV), k_slots, v_slots, n_programs=n_programs, stages=stages
    )
    assert torch.equal(k_slots.cpu().isnan(), want_k.isnan())  # skipped items and untouched slots keep their poison
    assert torch.equal(k_slots.cpu().nan_to_num(), want_k.nan_to_num())
    assert torch.equal(v_slots.cpu().nan_to_num(), want_v.nan_to_num())


def test_tma_gather_rejects_items_of_partial_rows():
    host_k, host_v, k_slots, v_slots = make_pool(3, 1, 2, 8, 4, seed=0)  # 2 x 8 bf16 = 32 bytes an item
    z = torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="128-byte rows"):
        tma_gather(host_k, host_v, z, z, z, k_slots, v_slots)
