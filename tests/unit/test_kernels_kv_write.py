"""oasis_kernels.kv_write against its plain-torch reference (interpreter on CPU; the realistic shape on the GPU)."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (sets TRITON_INTERPRET without CUDA)
from oasis_exec import ops
from oasis_kernels.kv_write import kv_write, kv_write_ref


def _case(B, H, D, bs, n_rows, dtype, device, strided, seed=0):
    g = torch.Generator().manual_seed(seed)
    if strided:  # k[:, 0] of a [B, 2, H, D] tensor, as the lookahead step passes it
        k_new = torch.randn(B, 2, H, D, generator=g).to(dtype).to(device)[:, 0]
        v_new = torch.randn(B, 2, H, D, generator=g).to(dtype).to(device)[:, 0]
    else:
        k_new = torch.randn(B, H, D, generator=g).to(dtype).to(device)
        v_new = torch.randn(B, H, D, generator=g).to(dtype).to(device)
    kc = torch.randn(n_rows, bs, D, generator=g).to(dtype).to(device)
    vc = torch.randn(n_rows, bs, D, generator=g).to(dtype).to(device)
    row = torch.randperm(n_rows, generator=g)[: B * H].to(torch.int32)
    row[torch.rand(B * H, generator=g) < 0.2] = -1
    off = torch.randint(0, bs, (B,), generator=g, dtype=torch.int32)
    return k_new, v_new, kc, vc, row.to(device), off.to(device)


@pytest.mark.parametrize(
    "B,H,D,bs,strided,dtype",
    [(3, 2, 16, 4, False, torch.float32), (2, 4, 32, 8, True, torch.bfloat16), (1, 1, 64, 16, False, torch.bfloat16)],
)
def test_kv_write_equals_reference(B, H, D, bs, strided, dtype):
    k_new, v_new, kc, vc, row, off = _case(B, H, D, bs, 4 * B * H, dtype, "cpu", strided)
    kr, vr = kc.clone(), vc.clone()
    kv_write_ref(k_new, v_new, kr, vr, row, off)
    kv_write(k_new, v_new, kc, vc, row, off)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    live = row >= 0  # the reference really wrote the live items and nothing else
    r, o = row.long().view(B, H), off.long()[:, None].expand(B, H)
    assert torch.equal(kr[r[live.view(B, H)], o[live.view(B, H)]], k_new[live.view(B, H)])


def test_ops_plain_path_equals_reference_on_live_rows():
    k_new, v_new, kc, vc, row, off = _case(3, 2, 16, 4, 24, torch.float32, "cpu", True, seed=3)
    row = torch.randperm(24)[:6].to(torch.int32)  # every row live, as the runner passes them
    kr, vr = kc.clone(), vc.clone()
    kv_write_ref(k_new, v_new, kr, vr, row, off)
    ops.kv_write(k_new, v_new, kc, vc, row, off, fused=False)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)


@pytest.mark.gpu
def test_kv_write_gpu_realistic():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the GPU machine with `pytest -m gpu`)")
    k_new, v_new, kc, vc, row, off = _case(64, 8, 128, 16, 64 * 8 * 3, torch.bfloat16, "cuda", True, seed=5)
    kr, vr = kc.clone(), vc.clone()
    kv_write_ref(k_new, v_new, kr, vr, row, off)
    kv_write(k_new, v_new, kc, vc, row, off)
    torch.cuda.synchronize()
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
