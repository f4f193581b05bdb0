"""The native (C, ctypes) host gather against torch indexing: compaction, -1 padding, the slot list, errors."""

import threading

import pytest
import torch

from oasis_kernels import host_native

pytestmark = pytest.mark.skipif(not host_native.available(), reason="no C compiler")


def setup(n_blocks, Hkv, BS, D, n, cap, seed, dtype=torch.bfloat16, pad=0.25):
    g = torch.Generator().manual_seed(seed)
    host_k = torch.randn(n_blocks, Hkv, BS, D, generator=g).to(dtype)
    host_v = torch.randn(n_blocks, Hkv, BS, D, generator=g).to(dtype)
    flat = torch.randint(0, n_blocks * Hkv, (n,), generator=g, dtype=torch.int32)
    flat[torch.rand(n, generator=g) < pad] = -1
    dst = torch.randperm(4 * n + 8, generator=g)[:n].to(torch.int32)
    stage_k = torch.full((cap, BS, D), float("nan"), dtype=dtype)
    stage_v = stage_k.clone()
    dst_out = torch.full((cap,), 12345, dtype=torch.int32)
    return host_k, host_v, flat, dst, stage_k, stage_v, dst_out


@pytest.mark.parametrize("threads,dtype,seed", [(1, torch.bfloat16, 0), (3, torch.bfloat16, 1), (4, torch.float32, 2)])
def test_matches_torch_indexing(threads, dtype, seed):
    nb, Hkv, BS, D, n, cap = 37, 4, 4, 8, 300, 320
    host_k, host_v, flat, dst, sk, sv, dout = setup(nb, Hkv, BS, D, n, cap, seed, dtype)
    m = host_native.Gatherer(cap, threads).gather_rows(host_k, host_v, flat, dst, n, sk, sv, dout)
    live = flat >= 0
    rows = flat[live].long()
    assert m == int(live.sum()) and 0 < m < n
    assert torch.equal(sk[:m], host_k.view(nb * Hkv, BS, D)[rows])
    assert torch.equal(sv[:m], host_v.view(nb * Hkv, BS, D)[rows])
    assert torch.equal(dout[:m], dst[live]) and bool((dout[m:] == -1).all())
    assert torch.isnan(sk[m:].float()).all()  # nothing written past the staged prefix


def test_prefix_only_and_empty():
    host_k, host_v, flat, dst, sk, sv, dout = setup(5, 2, 2, 4, 10, 10, seed=3, pad=0.0)
    g = host_native.Gatherer(10, 2)
    assert g.gather_rows(host_k, host_v, flat, dst, 0, sk, sv, dout) == 0 and bool((dout == -1).all())
    m = g.gather_rows(host_k, host_v, flat, dst, 4, sk, sv, dout)  # only the first n entries count
    assert m == 4 and torch.equal(dout[:4], dst[:4]) and bool((dout[4:] == -1).all())
    assert torch.equal(sk[:4], host_k.view(10, 2, 4)[flat[:4].long()])


def test_errors():
    host_k, host_v, flat, dst, sk, sv, dout = setup(5, 2, 2, 4, 10, 10, seed=4, pad=0.0)
    g = host_native.Gatherer(10, 2)
    bad = flat.clone()
    bad[7] = 10  # rows are 0..9
    with pytest.raises(IndexError, match="entry 7"):
        g.gather_rows(host_k, host_v, bad, dst, 10, sk, sv, dout)
    with pytest.raises(ValueError, match="capacity"):
        g.gather_rows(host_k, host_v, flat, dst, 10, sk[:6], sv[:6], dout[:6])
    with pytest.raises(ValueError, match="int32"):
        g.gather_rows(host_k, host_v, flat.long(), dst, 10, sk, sv, dout)
    with pytest.raises(ValueError, match="staging rows"):
        g.gather_rows(host_k, host_v, flat, dst, 10, sk[:, :1].contiguous(), sv[:, :1].contiguous(), dout)
    with pytest.raises(ValueError, match="outside"):
        g.gather_rows(host_k, host_v, flat, dst, 11, sk, sv, dout)
    with pytest.raises(ValueError, match="n_threads"):
        host_native.Gatherer(10, 0)


def test_runs_without_the_gil():
    """While one thread is inside the foreign call, another thread can run Python (ctypes drops the GIL)."""
    nb, Hkv, BS, D, n = 4096, 8, 16, 128, 12000
    host_k, host_v, flat, dst, sk, sv, dout = setup(nb, Hkv, BS, D, n, n, seed=5, pad=0.0)
    g = host_native.Gatherer(n, 1)
    ticks, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        before = ticks[0]
        for _ in range(5):
            g.gather_rows(host_k, host_v, flat, dst, n, sk, sv, dout)
        during = ticks[0] - before
    finally:
        stop.set()
        t.join()
    assert during > 0
    assert host_native.openmp() in (True, False)
