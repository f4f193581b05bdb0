"""The exact-size pinned host pool (cudaHostRegister instead of PyTorch's power-of-two pinned allocator), on the CPU
with the CUDA calls replaced by fakes: sizes, per-layer views, reuse within a process, release, refusal."""

import pytest
import torch

from oasis_exec.kv import store as KS


@pytest.fixture
def fake_cuda(monkeypatch):
    log = {"reg": [], "unreg": [], "refuse_after": None}

    def reg(ptr, nbytes):
        if log["refuse_after"] is not None and len(log["reg"]) - len(log["unreg"]) >= log["refuse_after"]:
            return 2  # cudaErrorMemoryAllocation
        log["reg"].append((ptr, nbytes))
        return 0

    monkeypatch.setattr(KS, "_cuda_register", reg)
    monkeypatch.setattr(KS, "_cuda_unregister", lambda ptr: log["unreg"].append(ptr) or 0)
    monkeypatch.setattr(KS, "_same_device_pointer", lambda ptr: True)
    monkeypatch.setattr(KS, "_clear_cuda_error", lambda: None)
    monkeypatch.setattr(KS, "_PINNED", {"pieces": [], "piece_bytes": 0})
    return log


def test_pool_is_registered_exactly_per_layer_and_reused(fake_cuda):
    L, H, bs, D = 3, 2, 4, 8
    pool = KS.HostPool(L, 10, H, bs, D, torch.bfloat16, pin=True)
    per = 10 * H * bs * D * 2
    assert [n for _, n in fake_cuda["reg"]] == [per] * (2 * L)  # exact bytes, no power-of-two rounding
    assert len(pool.k) == len(pool.v) == L and pool.k[0].shape == (10, H, bs, D)
    assert pool.k[0].dtype == torch.bfloat16 and pool.nbytes == 2 * L * per
    ptrs = {t.data_ptr() for t in pool.k + pool.v}
    assert len(ptrs) == 2 * L  # every layer's K and V is its own piece
    pool.k[1][3, 1] = 1.5
    assert pool.k[1][3, 1].float().mean() == 1.5
    # a smaller pool in the same process reuses the registered pieces: no new registration
    small = KS.HostPool(L, 6, H, bs, D, torch.bfloat16, pin=True)
    assert len(fake_cuda["reg"]) == 2 * L and not fake_cuda["unreg"]
    assert {t.data_ptr() for t in small.k + small.v} == ptrs
    # a larger one releases the kept pieces first, then registers new ones
    big = KS.HostPool(L, 20, H, bs, D, torch.bfloat16, pin=True)
    assert len(fake_cuda["unreg"]) == 2 * L and len(fake_cuda["reg"]) == 4 * L
    assert big.k[2].shape == (20, H, bs, D)
    KS.release_pinned()
    assert len(fake_cuda["unreg"]) == 4 * L and KS._PINNED["pieces"] == []


def test_refused_registration_unregisters_what_it_took(fake_cuda):
    fake_cuda["refuse_after"] = 4
    with pytest.raises(RuntimeError, match="refused piece 5 of 6"):
        KS.HostPool(3, 10, 2, 4, 8, torch.bfloat16, pin=True)
    assert len(fake_cuda["unreg"]) == 4 and KS._PINNED["pieces"] == []
    fake_cuda["refuse_after"] = None
    pool = KS.HostPool(3, 10, 2, 4, 8, torch.bfloat16, pin=True)  # a later, fitting request still works
    assert len(pool.k) == 3


def test_unpinned_pool_on_cpu_registers_nothing(fake_cuda):
    pool = KS.HostPool(2, 5, 2, 4, 8, torch.float32, pin=False)
    assert not fake_cuda["reg"] and pool.k[0].shape == (5, 2, 4, 8) and not pool.k[0].is_pinned()
