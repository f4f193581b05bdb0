"""The fp8 (e4m3) host copy: the torch quantize/dequantize round trip within e4m3's bound, and the Triton kernels
(write-back, UVA gather, staged scatter, the code conversions) equal to the torch reference under the interpreter:
the same fp8 bytes and scales, the same dequantized values."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA; before triton is first imported)
from oasis_exec.kv.host_quant import dequantize, error_bound, quantize, roundtrip
from oasis_exec.kv.store import HostPool
from oasis_exec.transfer.writeback import writeback_full, writeback_kernel
from oasis_kernels.fp8 import e4m3_bits, e4m3_value, tl, triton
from oasis_kernels.gather import HostStager, gather_ref, uva_gather

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FP8 = torch.float8_e4m3fn
SCALES = (0.0, 1e-6, 1e-3, 0.3, 1.0, 40.0, 3e3)  # one per unit: an all-zero unit, tiny, ..., large


def _units(n, bs, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    mag = torch.tensor([SCALES[i % len(SCALES)] for i in range(n)])[:, None, None]
    x = torch.randn(n, bs, D, generator=g) * mag
    x[1, 0, 0] = 0.0  # zeros and exact ties are in there too
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_error_within_the_e4m3_bound_of_each_unit(dtype):
    x = _units(28, 4, 16, dtype, seed=0)
    q, s = quantize(x)
    assert q.dtype == FP8 and s.dtype == torch.float32 and s.shape == (28,)
    y = dequantize(q, s, dtype)
    assert y.dtype == dtype
    err = (y.float() - x.float()).abs()
    rounding = y.float().abs() * (2.0**-8 if dtype == torch.bfloat16 else 0.0)  # the compute dtype's own rounding
    assert (err <= error_bound(x)[:, None, None] + rounding).all()
    amax = x.float().abs().amax((-2, -1))
    assert torch.equal(s[amax == 0], torch.ones_like(s[amax == 0]))  # amax 0: scale 1, codes 0, values 0
    assert (y[amax == 0] == 0).all()
    top = (x.float().abs() == amax[:, None, None]) & (amax[:, None, None] > 0)
    assert torch.allclose(y.float()[top].abs(), x.float()[top].abs(), rtol=2**-7)  # a unit's max reads back ~exactly
    assert torch.equal(roundtrip(x), y)


def test_round_trip_relative_error_is_at_most_2_pow_minus_4_above_the_subnormals():
    x = _units(14, 16, 32, torch.float32, seed=1)
    y = roundtrip(x)
    amax = x.abs().amax((-2, -1), keepdim=True)
    normal = x.abs() >= amax * 2.0**-6 / 448 * 1.01  # e4m3's normal range after the scale
    rel = ((y - x).abs() / x.abs().clamp_min(1e-30))[normal]
    assert rel.max() <= 2.0**-4 * (1 + 1e-5)


def test_scale_and_its_inverse_are_one_correctly_rounded_division():
    """The kernels divide with div_rn; the reference must too. ``448 / t`` in torch is ``t.reciprocal() * 448``: for
    amax = 504 * 2^-17 that inverse is an ulp high, and x = 225 * 2^-17 (exactly 200 after scaling, a tie between
    the e4m3 codes of 192 and 208) rounded to 208 instead of 192 (the H200 kernel's code, 2026-12-02)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(400, 2, 8, generator=g) * torch.logspace(-7, 3, 400)[:, None, None]
    x[0, 0, 0], x[0, 0, 1] = 504 * 2.0**-17, 225 * 2.0**-17  # the tie; the other values of unit 0 are smaller
    x[0, 1:] = 0.0
    x[0, 0, 2:] = 0.0
    q, s = quantize(x)
    amax = x.abs().amax((-2, -1)).double()
    assert torch.equal(s, (amax / 448).float())  # float64 then float32: the correctly rounded float32 quotient
    inv = (448 / amax).float()
    assert torch.equal(q.float(), (x * inv[:, None, None]).clamp(-448, 448).to(FP8).float())
    assert q[0, 0, 1].float().item() == 192.0
    assert q[0, 0, 1].view(torch.uint8).item() == 0x74
    pool = HostPool(1, 400, 1, 2, 8, torch.float32, pin=False, quantized=True)
    i = torch.arange(400, dtype=torch.int32)
    writeback_kernel(
        x, x.clone(), pool.k[0], pool.v[0], i, i, torch.full_like(i, 2), 2, (pool.k_scale[0], pool.v_scale[0])
    )
    assert torch.equal(pool.k[0][:, 0].view(torch.uint8), q.view(torch.uint8)) and torch.equal(pool.k_scale[0][:, 0], s)


@triton.jit
def _codes_kernel(C, V, Y, B, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(V + offs, e4m3_value(tl.load(C + offs).to(tl.int32)))
    tl.store(B + offs, e4m3_bits(tl.load(Y + offs)))


def test_e4m3_code_conversions_equal_torch_on_every_code_and_every_tie():
    c = torch.arange(256, dtype=torch.int32)
    c = c[(c != 0x7F) & (c != 0xFF)].to(torch.uint8)  # the two NaN codes are never written
    vals = c.view(FP8).float()
    srt = vals[vals >= 0].unique().sort().values
    ties = (srt[:-1] + srt[1:]) / 2  # exactly between neighbours: round to the even code
    g = torch.Generator().manual_seed(2)
    rand = torch.cat([torch.randn(600, generator=g) * m for m in (1e-3, 0.05, 1.0, 30.0, 200.0)])
    y = torch.cat([vals, ties, -ties, rand, torch.tensor([448.0, -448.0, 0.0, -0.0, 2.0**-10, 3 * 2.0**-11])])
    n = 4096
    y = torch.cat([y.clamp(-448, 448), torch.zeros(n - y.numel())])
    cin = torch.cat([c, torch.zeros(n - c.numel(), dtype=torch.uint8)])
    v, b = torch.empty(n), torch.empty(n, dtype=torch.int32)
    _codes_kernel[(1,)](cin, v, y, b, N=n)
    assert torch.equal(v, cin.view(FP8).float())
    assert torch.equal(b, y.to(FP8).view(torch.uint8).int())


def _pool(nb, H, bs, D, dtype, seed, quantized=True):
    pool = HostPool(2, nb, H, bs, D, dtype, pin=False, quantized=quantized)
    g = torch.Generator().manual_seed(seed)
    for l in range(2):
        x = torch.randn(nb, H, bs, D, generator=g) * torch.rand(nb, H, 1, 1, generator=g) * 5
        pool.write(l, torch.arange(nb), x.to(dtype), (2 * x).to(dtype))
    return pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("roundtrip_slots", [False, True])
def test_write_back_kernel_equals_the_torch_reference_bit_for_bit(dtype, roundtrip_slots):
    nb, H, bs, D, n_slots = 5, 2, 4, 16, 12
    slots_k = _units(n_slots, bs, D, dtype, seed=3)
    slots_v = _units(n_slots, bs, D, dtype, seed=4)
    src = torch.tensor([0, 3, 7, 1, 11, 5, 2], dtype=torch.int32)  # slot 0 is all zero
    dst = torch.tensor([9, 0, 4, 7, 2, 3, 8], dtype=torch.int32)  # units block * H + head
    n_valid = torch.tensor([bs, bs, 2, bs, bs, 0, bs], dtype=torch.int32)  # two not full: skipped
    got, want = [], []
    for fn, out in ((writeback_kernel, got), (writeback_full, want)):
        pool = HostPool(1, nb, H, bs, D, dtype, pin=False, quantized=True)
        pool.k[0].view(torch.uint8).fill_(0x55)
        pool.v[0].view(torch.uint8).fill_(0x55)
        pool.k_scale[0].fill_(-1.0)
        pool.v_scale[0].fill_(-1.0)
        sk, sv = slots_k.clone(), slots_v.clone()
        fn(sk, sv, pool.k[0], pool.v[0], src, dst, n_valid, bs, (pool.k_scale[0], pool.v_scale[0]), roundtrip_slots)
        out.append((pool.k[0].view(torch.uint8), pool.v[0].view(torch.uint8), pool.k_scale[0], pool.v_scale[0], sk, sv))
    for a, b in zip(got[0], want[0]):
        assert torch.equal(a, b)
    written = torch.zeros(nb * H, dtype=torch.bool)
    written[dst[n_valid == bs].long()] = True
    assert (want[0][2].view(-1)[written] > 0).all() and (want[0][2].view(-1)[~written] == -1).all()
    sk, sv = want[0][4], want[0][5]
    if roundtrip_slots:  # the written slots hold what their host copy reads back as
        full = src[n_valid == bs].long()
        assert torch.equal(sk[full], roundtrip(slots_k[full]))
        assert not torch.equal(sk[full], slots_k[full])
    else:
        assert torch.equal(sk, slots_k) and torch.equal(sv, slots_v)


@pytest.mark.parametrize("dtype,ipi", [(torch.float32, 2), (torch.bfloat16, 2), (torch.bfloat16, 8)])
def test_uva_gather_dequantizes_like_the_torch_reference(dtype, ipi):
    nb, H, bs, D, n_slots = 6, 2, 4, 16, 14
    pool = _pool(nb, H, bs, D, dtype, seed=5)
    sb = torch.tensor([0, 5, -1, 3, 2, 5, 1, 4], dtype=torch.int32)
    sh = torch.tensor([1, 0, 0, 1, 0, 1, 1, 0], dtype=torch.int32)
    ds = torch.tensor([3, 0, 9, 7, -1, 12, 5, 1], dtype=torch.int32)
    ks = torch.full((n_slots, bs, D), float("nan"), dtype=dtype)
    vs = ks.clone()
    sc = (pool.k_scale[1], pool.v_scale[1])
    uva_gather(pool.k[1], pool.v[1], sb, sh, ds, ks, vs, n_programs=3, items_per_iter=ipi, scales=sc)
    wk, wv = torch.full_like(ks, float("nan")), torch.full_like(vs, float("nan"))
    gather_ref(pool.k[1], pool.v[1], sb, sh, ds, wk, wv, scales=sc)
    assert torch.equal(ks.isnan(), wk.isnan()) and torch.equal(ks.nan_to_num(), wk.nan_to_num())
    assert torch.equal(vs.nan_to_num(), wv.nan_to_num())
    live = ((sb >= 0) & (ds >= 0)).nonzero().flatten()
    k, v = pool.read(1, sb[live].long(), sh[live].long())  # HostPool.read: the inline path's dequantization
    assert torch.equal(ks[ds[live].long()], k) and torch.equal(vs[ds[live].long()], v)
    assert torch.equal(
        k, dequantize(pool.k[1][sb[live].long(), sh[live].long()], sc[0][sb[live].long(), sh[live].long()], dtype)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_fp8_rows_and_scales_scatter_like_the_reference(dtype):
    nb, H, bs, D, n_slots = 6, 2, 4, 16, 14
    pool = _pool(nb, H, bs, D, dtype, seed=6)
    sb = torch.tensor([4, 0, 5, 2, 1], dtype=torch.int32)
    sh = torch.tensor([0, 1, 1, 0, 1], dtype=torch.int32)
    ds = torch.tensor([2, 11, 6, 0, 8], dtype=torch.int32)
    stager = HostStager(8, bs, D, dtype=dtype, device="cpu", n_threads=None, quantized=True)
    assert stager.stage_k.dtype == FP8 and stager.gpu_ks.dtype == torch.float32
    sc = (pool.k_scale[0], pool.v_scale[0])
    n = stager.gather(pool.k[0], pool.v[0], sb, sh, scales=sc)
    stager.upload(n)
    dst = torch.full((8,), -1, dtype=torch.int32)
    dst[:n] = ds
    ks = torch.full((n_slots, bs, D), float("nan"), dtype=dtype)
    vs = ks.clone()
    stager.scatter(dst, ks, vs)
    wk, wv = torch.full_like(ks, float("nan")), torch.full_like(vs, float("nan"))
    gather_ref(pool.k[0], pool.v[0], sb, sh, ds, wk, wv, scales=sc)
    assert torch.equal(ks.nan_to_num(), wk.nan_to_num()) and torch.equal(vs.nan_to_num(), wv.nan_to_num())
    assert torch.equal(ks.isnan(), wk.isnan())


def test_native_gather_moves_fp8_rows_and_their_scales():
    from oasis_kernels import host_native

    if not host_native.available():
        pytest.skip("no C compiler")
    nb, H, bs, D = 6, 2, 4, 16
    pool = _pool(nb, H, bs, D, torch.float32, seed=7)
    flat = torch.tensor([3, -1, 10, 0, 7], dtype=torch.int32)
    dst = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32)
    g = host_native.Gatherer(8, 1)
    stk, stv = torch.empty(8, bs, D, dtype=FP8), torch.empty(8, bs, D, dtype=FP8)
    sks, svs = torch.empty(8), torch.empty(8)
    out = torch.empty(8, dtype=torch.int32)
    m = g.gather_rows(pool.k[0], pool.v[0], flat, dst, 5, stk, stv, out)
    g.gather_rows(
        pool.k_scale[0].view(nb, H, 1), pool.v_scale[0].view(nb, H, 1), flat, dst, 5, sks[:, None], svs[:, None], out
    )
    live = flat[flat >= 0].long()
    assert m == 4
    assert torch.equal(stk[:m].view(torch.uint8), pool.k[0].view(nb * H, bs, D)[live].view(torch.uint8))
    assert torch.equal(sks[:m], pool.k_scale[0].view(-1)[live]) and torch.equal(svs[:m], pool.v_scale[0].view(-1)[live])


@pytest.mark.parametrize("dtype,ratio", [(torch.bfloat16, 2), (torch.float32, 4)])
def test_an_fp8_pool_takes_a_byte_an_element_plus_its_scales(dtype, ratio):
    nb, H, bs, D = 10, 2, 16, 64
    full = HostPool(3, nb, H, bs, D, dtype, pin=False)
    fp8 = HostPool(3, nb, H, bs, D, dtype, pin=False, quantized=True)
    units = 3 * nb * H * 2  # layers x blocks x heads x (K, V)
    assert fp8.nbytes == units * (bs * D + 4)
    assert full.nbytes == ratio * units * bs * D
    assert (full.unit_bytes, fp8.unit_bytes) == (2 * ratio * bs * D, 2 * (bs * D + 4))
    x = torch.randn(2, H, bs, D).to(dtype)
    fp8.write(2, torch.tensor([7, 1]), x, -x)
    k, v = fp8.read(2, torch.tensor([7, 1, 7]), torch.tensor([0, 1, 1]))
    assert torch.equal(k, roundtrip(x)[[0, 1, 0], [0, 1, 1]]) and torch.equal(v, roundtrip(-x)[[0, 1, 0], [0, 1, 1]])


@pytest.mark.gpu
def test_kernels_on_the_gpu_equal_the_torch_reference():
    """On the GPU: the write-back kernel writes the reference's fp8 bytes and scales through UVA (pinned pool), and
    the UVA gather reads them back as the reference's bf16 values (div_rn, the integer conversions)."""
    nb, H, bs, D, n_slots = 64, 4, 16, 128, 300
    slots_k = _units(n_slots, bs, D, torch.bfloat16, seed=8).cuda()
    slots_v = _units(n_slots, bs, D, torch.bfloat16, seed=9).cuda()
    g = torch.Generator().manual_seed(8)
    src = torch.randperm(n_slots, generator=g)[: nb * H].to(torch.int32)
    dst = torch.randperm(nb * H, generator=g).to(torch.int32)
    full = torch.full_like(src, bs)
    pool = HostPool(1, nb, H, bs, D, torch.bfloat16, pin=True, quantized=True)
    ref = HostPool(1, nb, H, bs, D, torch.bfloat16, pin=False, quantized=True)
    sc = (pool.k_scale[0], pool.v_scale[0])
    writeback_full(slots_k, slots_v, pool.k[0], pool.v[0], src.cuda(), dst.cuda(), full.cuda(), bs, sc)
    writeback_full(
        slots_k.cpu(), slots_v.cpu(), ref.k[0], ref.v[0], src, dst, full, bs, (ref.k_scale[0], ref.v_scale[0])
    )
    torch.cuda.synchronize()
    assert torch.equal(pool.k[0].view(torch.uint8), ref.k[0].view(torch.uint8))
    assert torch.equal(pool.v[0].view(torch.uint8), ref.v[0].view(torch.uint8))
    assert torch.equal(pool.k_scale[0], ref.k_scale[0]) and torch.equal(pool.v_scale[0], ref.v_scale[0])
    q, s = quantize(slots_k[src.long()])  # the torch path on CUDA tensors (a prefill's host copies) gives them too
    assert torch.equal(q.cpu().view(torch.uint8), pool.k[0].view(nb * H, bs, D)[dst.long()].view(torch.uint8))
    assert torch.equal(s.cpu(), pool.k_scale[0].view(-1)[dst.long()])
    sb = (dst // H).to(torch.int32)
    sh = (dst % H).to(torch.int32)
    ks, vs = torch.zeros_like(slots_k), torch.zeros_like(slots_v)
    uva_gather(pool.k[0], pool.v[0], sb.cuda(), sh.cuda(), src.cuda(), ks, vs, n_programs=16, scales=sc)
    torch.cuda.synchronize()
    k, v = ref.read(0, sb.long(), sh.long())
    assert torch.equal(ks[src.long()].cpu(), k) and torch.equal(vs[src.long()].cpu(), v)
    assert torch.equal(ks[src.long()].cpu(), roundtrip(slots_k[src.long()].cpu()))
