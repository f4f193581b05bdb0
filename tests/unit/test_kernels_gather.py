"""Host->GPU gather paths vs the reference copy; the persistent loop, the count bound, -1 padding."""

import pytest
import torch
from gather_cases import DEV, make_pool, random_list

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_kernels.gather import HostStager, copy_list, gather_ref, uva_gather


@pytest.mark.parametrize("n_programs,ipi,use_count", [(3, 2, True), (2, 1, False), (16, 4, False)])
def test_uva_gather_persistent_matches_reference(n_programs, ipi, use_count):
    n_host, Hkv, BS, D, n_slots, C = 9, 2, 4, 16, 20, 13
    host_k, host_v, k_slots, v_slots = make_pool(n_host, Hkv, BS, D, n_slots, seed=n_programs)
    g = torch.Generator().manual_seed(ipi)
    sb, sh, ds = random_list(C, n_host, Hkv, n_slots, g)
    count = torch.tensor([10], dtype=torch.int32) if use_count else None
    want_k, want_v = k_slots.cpu().clone(), v_slots.cpu().clone()
    gather_ref(host_k, host_v, sb, sh, ds, want_k, want_v, count=count)
    to = lambda t: t.to(DEV) if t is not None else None
    uva_gather(
        host_k.to(DEV) if DEV == "cpu" else host_k.pin_memory(),
        host_v.to(DEV) if DEV == "cpu" else host_v.pin_memory(),
        to(sb),
        to(sh),
        to(ds),
        k_slots,
        v_slots,
        count=to(count),
        n_programs=n_programs,
        items_per_iter=ipi,
    )
    assert torch.equal(k_slots.cpu().isnan(), want_k.isnan())  # untouched slots keep their poison
    assert torch.equal(k_slots.cpu().nan_to_num(), want_k.nan_to_num())
    assert torch.equal(v_slots.cpu().nan_to_num(), want_v.nan_to_num())
    n_live = sum(1 for i in range(10 if use_count else C) if sb[i] >= 0 and ds[i] >= 0)
    assert (~want_k.isnan().reshape(n_slots, -1).all(1)).sum() == n_live


def test_host_stage_then_scatter_matches_reference():
    n_host, Hkv, BS, D, n_slots, C = 9, 2, 4, 16, 20, 11
    host_k, host_v, k_slots, v_slots = make_pool(n_host, Hkv, BS, D, n_slots, seed=4)
    g = torch.Generator().manual_seed(4)
    sb, sh, ds = random_list(C, n_host, Hkv, n_slots, g)
    live = (sb >= 0) & (ds >= 0)
    stager = HostStager(16, BS, D, device=DEV, n_threads=2)
    stager.stage_k.fill_(float("nan"))
    n = stager.gather(host_k, host_v, sb[live], sh[live])
    stager.upload(n)
    dst = torch.full((16,), -1, dtype=torch.int32)
    dst[:n] = ds[live]
    stager.scatter(dst.to(DEV), k_slots, v_slots)
    stager.close()
    want_k, want_v = torch.full_like(k_slots.cpu(), float("nan")), torch.full_like(v_slots.cpu(), float("nan"))
    gather_ref(host_k, host_v, sb, sh, ds, want_k, want_v)
    assert torch.equal(k_slots.cpu().isnan(), want_k.isnan())
    assert torch.equal(k_slots.cpu().nan_to_num(), want_k.nan_to_num())
    assert torch.equal(v_slots.cpu().nan_to_num(), want_v.nan_to_num())


def test_copy_list_from_plan():
    """Rows are (request, head); the host table maps each request's logical block to its pool block."""
    Hkv = 2
    fetch_block = torch.tensor([[3, -1], [0, 1], [2, -1], [-1, -1]])  # R = 2 requests x 2 heads, C = 2
    fetch_slot = torch.tensor([[7, -1], [4, 5], [9, -1], [-1, -1]])
    host_table = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    sb, sh, ds = copy_list(fetch_block, fetch_slot, Hkv, host_table)
    assert sb.tolist() == [13, -1, 10, 11, 22, -1, -1, -1]
    assert sh.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert ds.tolist() == [7, -1, 4, 5, 9, -1, -1, -1]
    assert sb.dtype == sh.dtype == ds.dtype == torch.int32


@pytest.mark.gpu
def test_uva_gather_gpu_reads_pinned_host_memory():
    n_host, Hkv, BS, D, n_slots, C = 4096, 8, 16, 128, 6000, 4096
    host_k, host_v, k_slots, v_slots = make_pool(n_host, Hkv, BS, D, n_slots, seed=0, pin=True)
    g = torch.Generator().manual_seed(0)
    sb, sh, ds = random_list(C, n_host, Hkv, n_slots, g)
    uva_gather(host_k, host_v, sb.cuda(), sh.cuda(), ds.cuda(), k_slots, v_slots, n_programs=16)
    torch.cuda.synchronize()
    live = ((sb >= 0) & (ds >= 0)).nonzero().flatten()
    assert torch.equal(k_slots[ds[live].long()].cpu(), host_k[sb[live].long(), sh[live].long()])
    assert torch.equal(v_slots[ds[live].long()].cpu(), host_v[sb[live].long(), sh[live].long()])


@pytest.mark.gpu
def test_host_stager_gpu():
    n_host, Hkv, BS, D, n_slots, C = 4096, 8, 16, 128, 6000, 2048
    host_k, host_v, k_slots, v_slots = make_pool(n_host, Hkv, BS, D, n_slots, seed=1, pin=True)
    g = torch.Generator().manual_seed(1)
    sb = torch.randint(0, n_host, (C,), generator=g, dtype=torch.int32)
    sh = torch.randint(0, Hkv, (C,), generator=g, dtype=torch.int32)
    ds = torch.randperm(n_slots, generator=g)[:C].to(torch.int32)
    stager = HostStager(C, BS, D, n_threads=8)
    stager.upload(stager.gather(host_k, host_v, sb, sh))
    stager.scatter(ds.cuda(), k_slots, v_slots)
    torch.cuda.synchronize()
    stager.close()
    assert torch.equal(k_slots[ds.long()].cpu(), host_k[sb.long(), sh.long()])
    assert torch.equal(v_slots[ds.long()].cpu(), host_v[sb.long(), sh.long()])


@pytest.mark.parametrize("n_threads", [None, 1, 2])
def test_host_gather_stage_many_blocks_flat_rows(n_threads):
    """Many (block, head) items across heads, by (block, head) or by precomputed flat row with -1 padding dropped."""
    from oasis_kernels.gather import host_gather_stage

    n_host, Hkv, BS, D, C = 300, 4, 4, 16, 700
    host_k, host_v, _, _ = make_pool(n_host, Hkv, BS, D, 1, seed=7)
    g = torch.Generator().manual_seed(7)
    sb = torch.randint(0, n_host, (C,), generator=g, dtype=torch.int32)
    sh = torch.randint(0, Hkv, (C,), generator=g, dtype=torch.int32)
    stager = HostStager(C + 5, BS, D, device="cpu", n_threads=n_threads)
    assert stager.gather(host_k, host_v, sb, sh) == C
    assert torch.equal(stager.stage_k[:C], host_k[sb.long(), sh.long()])
    assert torch.equal(stager.stage_v[:C], host_v[sb.long(), sh.long()])
    flat = torch.where(torch.arange(C) % 3 == 0, -1, sb * Hkv + sh).to(torch.int32)  # padded copy list
    live = flat >= 0
    m = host_gather_stage(host_k, host_v, None, None, stager.stage_k, stager.stage_v, flat=flat[live])
    assert m == int(live.sum())
    assert torch.equal(stager.stage_v[:m], host_v[sb[live].long(), sh[live].long()])
    assert host_gather_stage(host_k, host_v, sb[:0], sh[:0], stager.stage_k, stager.stage_v) == 0
    stager.close()


def test_gather_thread_owns_its_thread_count():
    from oasis_kernels.gather import gather_thread

    before = torch.get_num_threads()
    ex = gather_thread(1)
    assert ex.submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == before
    ex.shutdown()
