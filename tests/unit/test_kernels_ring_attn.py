"""ring_attn (a sliding layer's decode attention over its ring, read in place) vs ``RingKV.attend_torch`` (the gather +
fp32 einsum path, the reference), on random rings (CPU: Triton interpreter; GPU: tests/gpu/test_ring_attn_gpu.py).

Tolerances: fp32 rings and bf16 / fp16 rings with an fp32 ``out`` (the kernel's fp32 result before rounding) within
fp32 accumulation-order noise (rtol 1e-5, atol 2e-6); a bf16 output within one bf16 step of the fp32 reference (the
rounding of the result: the interpreter's float32 -> bfloat16 cast truncates, the GPU's rounds to nearest)."""

from types import SimpleNamespace

import pytest
import torch

import oasis_kernels  # noqa: F401  (turns the Triton interpreter on without CUDA, before kernel modules load)
from oasis_exec import ops
from oasis_exec.kv.ring import RingKV
from oasis_kernels.ring_attn import ring_attn, ring_attn_ref, ring_valid

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TIGHT = dict(rtol=1e-5, atol=2e-6)


def make_ring(W, extra, H, D, max_lanes, dtype, seed, device=DEV, layer=3):
    """A RingKV of one sliding layer (index ``layer``) with random K/V in every slot (stale and never-written slots
    included: the mask alone must keep them out)."""
    spec = SimpleNamespace(
        sliding_layers=[layer], layer_window=lambda l: W, n_kv_heads=H, head_dim=D
    )  # the fields RingKV reads
    ring = RingKV(spec, max_lanes, extra, dtype, device)
    g = torch.Generator(device=device).manual_seed(seed)
    ring.k[layer].copy_(torch.randn(ring.k[layer].shape, generator=g, device=device).to(dtype))
    ring.v[layer].copy_(torch.randn(ring.v[layer].shape, generator=g, device=device).to(dtype))
    return ring, g


def queries(B, nq, Hq, D, dtype, g, device=DEV):
    """q [B, nq, Hq, D] as the decoder hands it: a transposed view (strides not those of a contiguous tensor)."""
    return torch.randn(B, Hq, nq, D, generator=g, device=device).to(dtype).transpose(1, 2)


def bf16_step(x):
    """The gap between bf16 neighbours at |x| (the largest change one rounding of x to bf16 makes)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(1e-30)))
    return torch.exp2(e) * torch.finfo(torch.bfloat16).eps


CASES = [
    # (W, extra, H, G, D, nq, max_lanes, lanes, start positions of each row's first query)
    pytest.param(20, 1, 1, 4, 32, 1, 6, [4, 0, 5], [1000, 77, 20], id="wrap-G4"),  # ring wrapped many times
    pytest.param(20, 1, 1, 4, 32, 1, 4, [2, 3, 1, 0], [0, 1, 19, 20], id="early"),  # positions < W: invalid slots
    pytest.param(17, 3, 2, 1, 64, 4, 5, [3, 1], [18, 139], id="drafts-G1"),  # nq = 4 across a wrap, extra = 3
    pytest.param(30, 2, 1, 4, 16, 3, 7, [6, 2, 4], [5, 61, 300], id="drafts-G4"),  # early + wrapped rows, nq = 3
]


@pytest.mark.parametrize("W,extra,H,G,D,nq,max_lanes,lanes,start", CASES)
@pytest.mark.parametrize("n_split,block_n", [(1, 16), (3, 16), (None, 32)])
@pytest.mark.parametrize("idx", [torch.int64, torch.int32])
def test_ring_attn_fp32_equals_the_torch_path(W, extra, H, G, D, nq, max_lanes, lanes, start, n_split, block_n, idx):
    ring, g = make_ring(W, extra, H, D, max_lanes, torch.float32, seed=W * 7 + D + nq)
    B = len(lanes)
    lanes_t = torch.tensor(lanes, device=DEV)
    qpos = torch.tensor(start, device=DEV)[:, None] + torch.arange(nq, device=DEV)
    q = queries(B, nq, H * G, D, torch.float32, g)
    ref = ring.attend_torch(3, q, lanes_t, qpos)
    out = torch.full((B, nq, H * G, D), float("nan"), device=DEV)
    lanes_s = torch.stack([lanes_t, -lanes_t], 1).to(idx)[:, 0]  # a strided view
    ring_attn(q, ring.k[3], ring.v[3], lanes_s, qpos.to(idx), W, out=out, n_split=n_split, block_n=block_n)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, **TIGHT)


@pytest.mark.parametrize("W,extra,H,G,D,nq,max_lanes,lanes,start", CASES[::2] + [CASES[3]])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_split", [1, 2])
def test_ring_attn_half_rings_keep_fp32_math(W, extra, H, G, D, nq, max_lanes, lanes, start, dtype, n_split):
    """bf16 / fp16 rings: the fp32 result equals the fp32 reference on the same (upcast) values to fp32 noise (the
    probabilities are not rounded to the ring's dtype before the V product), and the output in the ring's dtype is
    that result rounded (within one step of the dtype of the reference)."""
    ring, g = make_ring(W, extra, H, D, max_lanes, dtype, seed=W + D + nq)
    B = len(lanes)
    lanes_t = torch.tensor(lanes, device=DEV)
    qpos = torch.tensor(start, device=DEV)[:, None] + torch.arange(nq, device=DEV)
    q = queries(B, nq, H * G, D, dtype, g)
    ref32 = ring_attn_ref(q.float(), ring.k[3].float(), ring.v[3].float(), lanes_t, qpos, W)
    out32 = torch.full((B, nq, H * G, D), float("nan"), device=DEV)
    ring_attn(q, ring.k[3], ring.v[3], lanes_t, qpos, W, out=out32, n_split=n_split, block_n=16)
    torch.testing.assert_close(out32, ref32, **TIGHT)
    out = ring_attn(q, ring.k[3], ring.v[3], lanes_t, qpos, W, n_split=n_split, block_n=16)
    assert out.dtype == dtype
    step = bf16_step(ref32) if dtype == torch.bfloat16 else 2.0 ** torch.floor(torch.log2(ref32.abs())) * 2**-10
    assert ((out.float() - ref32).abs() <= step + 1e-6).all()
    ref = ring.attend_torch(3, q, lanes_t, qpos)  # the torch path itself, rounded from its own fp32 result
    assert ((out.float() - ref.float()).abs() <= step + 1e-6).all()


def test_ring_attn_gemma_head_dim():
    """Gemma 3 270M's shape (1 KV head, 4 query heads, head_dim 256) on a short ring; bf16 ring, fp32 out."""
    W, extra, D = 24, 1, 256
    ring, g = make_ring(W, extra, 1, D, 3, torch.bfloat16, seed=5)
    lanes = torch.tensor([2, 0], device=DEV)
    qpos = torch.tensor([[9], [4000]], device=DEV)
    q = queries(2, 1, 4, D, torch.bfloat16, g)
    out32 = torch.empty(2, 1, 4, D, device=DEV)
    ring_attn(q, ring.k[3], ring.v[3], lanes, qpos, W, out=out32, n_split=2, block_n=16)
    ref32 = ring_attn_ref(q.float(), ring.k[3].float(), ring.v[3].float(), lanes, qpos, W)
    torch.testing.assert_close(out32, ref32, **TIGHT)


def test_ring_attn_ignores_slots_outside_every_window():
    """Huge (finite) keys and values in the slots a query must not see change nothing: a mask off by one, or a slot
    of the wrong lane, would dominate the softmax."""
    W, extra, D, nq = 12, 2, 32, 2
    ring, g = make_ring(W, extra, 1, D, 3, torch.float32, seed=11)
    R = W + extra
    lanes = torch.tensor([1, 2], device=DEV)
    qpos = torch.tensor([[5], [50]], device=DEV) + torch.arange(nq, device=DEV)
    q = queries(2, nq, 2, D, torch.float32, g)
    base = ring_attn(q, ring.k[3], ring.v[3], lanes, qpos, W, n_split=1, block_n=16)
    seen = ring_valid(qpos, R, W).any(1)  # [B, R]: slots some query of the row sees
    for b, lane in enumerate(lanes.tolist()):
        ring.k[3][lane, :, ~seen[b]] = 1e4
        ring.v[3][lane, :, ~seen[b]] = 1e4
    ring.k[3][0] = 1e4  # a lane no row reads
    got = ring_attn(q, ring.k[3], ring.v[3], lanes, qpos, W, n_split=1, block_n=16)
    torch.testing.assert_close(got, base, rtol=0, atol=0)
    # query 0 of each row does not see the slot query 1 wrote: poison it alone, query 0's output stays
    ring.k[3][lanes, :, qpos[:, 1] % R] = 1e4
    got = ring_attn(q, ring.k[3], ring.v[3], lanes, qpos, W, n_split=1, block_n=16)
    torch.testing.assert_close(got[:, 0], base[:, 0], rtol=0, atol=0)


def test_ref_and_ops_equal_the_ring_path_off_cuda():
    """``ring_attn_ref`` (what ``ops.ring_attn`` runs off CUDA) is ``RingKV.attend_torch``; ``RingKV.attend`` on the
    CPU is the torch path, the kernel switch or not."""
    W, extra, D = 10, 1, 16
    ring, g = make_ring(W, extra, 2, D, 4, torch.float32, seed=2, device="cpu")
    lanes = torch.tensor([3, 1, 2])
    qpos = torch.tensor([[0], [9], [123]])
    q = queries(3, 1, 4, D, torch.float32, g, device="cpu")
    ref = ring.attend_torch(3, q, lanes, qpos)
    assert torch.equal(ring_attn_ref(q, ring.k[3], ring.v[3], lanes, qpos, W), ref)
    assert torch.equal(ops.ring_attn(q, ring.k[3], ring.v[3], lanes, qpos, W), ref)
    assert torch.equal(ring.attend(3, q, lanes, qpos), ref)


def test_ring_attn_rejects_bad_inputs():
    ring, g = make_ring(8, 1, 1, 16, 2, torch.float32, seed=0, device="cpu")
    lanes, qpos = torch.tensor([0]), torch.tensor([[3]])
    q = queries(1, 1, 2, 16, torch.float32, g, device="cpu")
    with pytest.raises(AssertionError, match="qpos"):
        ring_attn(q, ring.k[3], ring.v[3], lanes, qpos.float(), 8)
    with pytest.raises(AssertionError, match="k_ring"):
        ring_attn(q, ring.k[3].to(torch.bfloat16), ring.v[3], lanes, qpos, 8)
    with pytest.raises(AssertionError, match="window"):
        ring_attn(q, ring.k[3], ring.v[3], lanes, qpos, 10)
