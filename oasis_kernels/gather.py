"""Host->GPU gather of KV blocks into GPU slots: the two candidate transfer paths.

Layout (one layer):

- host pool ``host_k, host_v: [n_host_blocks, Hkv, block_size, D]`` in pinned host memory (a view of a pool with a
  layer dim, ``pool[l]``, works too): one (block, KV head) of K, and of V, is ``block_size * D`` contiguous
  elements (4 KiB at 16 x 128 bf16);
- GPU slots ``k_slots, v_slots: [n_slots, block_size, D]`` (as in ``sparse_attn``);
- the copy list: ``src_block, src_head, dst_slot: [C]`` int32 (fixed capacity C, -1 padded: an item with
  ``src_block < 0`` or ``dst_slot < 0`` is skipped), optionally ``count: [1]`` int32 on the GPU bounding the live
  prefix. ``copy_list`` builds it from a ``StepPlan``'s ``fetch_block/fetch_slot`` without a host sync.

Path 1, direct read (``uva_gather``): a *persistent* kernel on ``n_programs`` programs (default 16) that loops over
the copy list and reads the pinned pool through its unified-virtual-address pointer. Few programs leave the rest of
the GPU to the decode step's compute (DESIGN.md: a full grid hid nothing, 16-32 programs hid 73-82%).
Pinned tensors are passed through ``UVAPointer``: Triton takes any object with ``data_ptr()`` and ``dtype``, and
its launcher maps the host address to the device address with ``cuPointerGetAttribute`` (identical under UVA for
``cudaHostAlloc``/``cudaHostRegister`` memory, which is what ``pin_memory`` gives).

Path 2, host-side gather (``HostStager``): one ``index_select`` per tensor, parallel on torch's intra-op threads,
copies the blocks into a pinned staging buffer (``host_gather_stage``), one DMA per tensor moves the live prefix to a GPU staging buffer (``upload``), and
``scatter_slots`` copies each staged block into its slot. Here the copy list's sources must be CPU tensors (the
host decides what to gather), while ``dst_slot`` for the scatter lives on the GPU.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl

from . import interpreting
from ._util import H2D_ROOFLINE_GBPS, cdiv, check
from .fp8 import dequant


class UVAPointer:
    """A pinned host tensor as a Triton pointer argument: the kernel reads host memory over PCIe."""

    def __init__(self, t: torch.Tensor):
        assert t.device.type == "cpu" and t.is_pinned(), "UVAPointer needs a pinned CPU tensor"
        self.tensor = t
        self.dtype = t.dtype

    def data_ptr(self) -> int:
        return self.tensor.data_ptr()


def _host_arg(t: torch.Tensor):
    """What to pass to a kernel for a host tensor: itself under the interpreter, else its UVA pointer."""
    if t.device.type == "cuda" or interpreting():
        return t
    return UVAPointer(t)


@triton.jit
def uva_gather_kernel(
    HK,
    HV,
    SRC_BLK,
    SRC_HEAD,
    DST,
    COUNT,
    KS,
    VS,
    HKS,
    HVS,
    n_items,
    stride_hkb,
    stride_hkh,
    stride_hvb,
    stride_hvh,
    stride_ks,
    stride_vs,
    n_heads,
    CHUNK: tl.constexpr,
    IPI: tl.constexpr,
    NPROG: tl.constexpr,
    HAS_COUNT: tl.constexpr,
    QUANT: tl.constexpr = False,
    OUT_BF16: tl.constexpr = True,
):
    """Persistent: program p copies items p*IPI.., (p+NPROG)*IPI.., ...; one item = one (block, head) of K and V.
    ``QUANT``: HK/HV are an fp8 pool's codes (uint8) and HKS/HVS its scales [n_blocks * n_heads] float32; the slots
    get ``codes * scale`` in their dtype (``oasis_kernels.fp8.dequant``)."""
    pid = tl.program_id(0)
    n = n_items
    if HAS_COUNT:
        n = tl.minimum(tl.load(COUNT), n_items)
    offs_i = tl.arange(0, IPI)
    offs_c = tl.arange(0, CHUNK)
    for i0 in range(pid * IPI, n, NPROG * IPI):
        i = i0 + offs_i
        in_list = i < n
        blk = tl.load(SRC_BLK + i, mask=in_list, other=-1)
        hd = tl.load(SRC_HEAD + i, mask=in_list, other=0)
        dst = tl.load(DST + i, mask=in_list, other=-1)
        live = (blk >= 0) & (dst >= 0)
        blk64 = tl.where(live, blk, 0).to(tl.int64)
        hd64 = tl.where(live, hd, 0).to(tl.int64)
        dst64 = tl.where(live, dst, 0).to(tl.int64)
        m = live[:, None]
        k = tl.load(HK + (blk64 * stride_hkb + hd64 * stride_hkh)[:, None] + offs_c[None, :], mask=m)
        v = tl.load(HV + (blk64 * stride_hvb + hd64 * stride_hvh)[:, None] + offs_c[None, :], mask=m)
        if QUANT:
            unit = blk64 * n_heads + hd64
            sk = tl.load(HKS + unit, mask=live, other=1.0)
            sv = tl.load(HVS + unit, mask=live, other=1.0)
            k = dequant(k.to(tl.int32), sk[:, None], OUT_BF16)
            v = dequant(v.to(tl.int32), sv[:, None], OUT_BF16)
        tl.store(KS + (dst64 * stride_ks)[:, None] + offs_c[None, :], k, mask=m)
        tl.store(VS + (dst64 * stride_vs)[:, None] + offs_c[None, :], v, mask=m)


def _check_pool_and_slots(host_k, host_v, k_slots, v_slots, scales=None):
    """The pool's and the slots' shapes; the slots' dtype is the pool's, or any float dtype for an fp8 pool with
    ``scales`` ``(k_scale, v_scale)`` [n_blocks, Hkv] float32."""
    nb, Hkv, BS, D = host_k.shape
    check(host_k, "host_k", (nb, Hkv, BS, D), None, None, inner_contiguous=2)
    check(host_v, "host_v", (nb, Hkv, BS, D), host_k.dtype, host_k.device, inner_contiguous=2)
    n_slots = k_slots.shape[0]
    slot_dtype = host_k.dtype
    if scales is not None:
        assert host_k.dtype == torch.float8_e4m3fn, f"scales go with a float8_e4m3fn pool, got {host_k.dtype}"
        for name, t in zip(("k_scale", "v_scale"), scales):
            check(t, name, (nb, Hkv), torch.float32, host_k.device, inner_contiguous=2)
        slot_dtype = k_slots.dtype
    check(k_slots, "k_slots", (n_slots, BS, D), slot_dtype, None, inner_contiguous=2)
    check(v_slots, "v_slots", (n_slots, BS, D), slot_dtype, k_slots.device, inner_contiguous=2)
    return nb, Hkv, BS, D


def uva_gather(
    host_k,
    host_v,
    src_block,
    src_head,
    dst_slot,
    k_slots,
    v_slots,
    count=None,
    n_programs=16,
    items_per_iter=2,
    num_warps=4,
    scales=None,
):
    """Direct-read gather of ``src (block, head)`` of the pinned host pool into ``dst_slot`` of the GPU slots.

    Launches ``n_programs`` persistent programs; no host synchronisation (the list and ``count`` stay on the GPU).
    ``scales``: ``(k_scale, v_scale)`` [n_blocks, Hkv] float32 (pinned) of an fp8 pool (``host_k``/``host_v``
    float8_e4m3fn): the kernel reads the codes (half the bytes of bf16) and the unit's scale, and writes the
    dequantized values in the slots' dtype (bf16, or float32 in CPU tests).
    """
    nb, Hkv, BS, D = _check_pool_and_slots(host_k, host_v, k_slots, v_slots, scales)
    dev = k_slots.device
    if dev.type == "cuda":
        assert host_k.device.type == "cuda" or (host_k.is_pinned() and host_v.is_pinned()), (
            "host_k/host_v must be pinned (or already on the GPU)"
        )
    C = src_block.shape[0]
    for name, t in (("src_block", src_block), ("src_head", src_head), ("dst_slot", dst_slot)):
        check(t, name, (C,), torch.int32, dev)
    if count is not None:
        check(count, "count", (1,), torch.int32, dev)
    if C == 0:
        return
    n_programs = max(1, min(n_programs, cdiv(C, items_per_iter)))
    quant = scales is not None
    hk, hv = (host_k.view(torch.uint8), host_v.view(torch.uint8)) if quant else (host_k, host_v)
    uva_gather_kernel[(n_programs,)](
        _host_arg(hk),
        _host_arg(hv),
        src_block,
        src_head,
        dst_slot,
        count if count is not None else src_block,
        k_slots,
        v_slots,
        _host_arg(scales[0]) if quant else src_block,
        _host_arg(scales[1]) if quant else src_block,
        C,
        host_k.stride(0),
        host_k.stride(1),
        host_v.stride(0),
        host_v.stride(1),
        k_slots.stride(0),
        v_slots.stride(0),
        Hkv,
        CHUNK=BS * D,
        IPI=items_per_iter,
        NPROG=n_programs,
        HAS_COUNT=count is not None,
        QUANT=quant,
        OUT_BF16=k_slots.dtype == torch.bfloat16,
        num_warps=num_warps,
    )


@triton.jit
def scatter_slots_kernel(
    SK,
    SV,
    DST,
    KS,
    VS,
    SKS,
    SVS,
    stride_sk,
    stride_sv,
    stride_ks,
    stride_vs,
    CHUNK: tl.constexpr,
    QUANT: tl.constexpr = False,
    OUT_BF16: tl.constexpr = True,
):
    """``QUANT``: the staged rows are fp8 codes (uint8) and SKS/SVS their scales [C] float32 (dequantized here)."""
    i = tl.program_id(0)
    dst = tl.load(DST + i)
    live = dst >= 0
    offs = tl.arange(0, CHUNK)
    m = live & (offs < CHUNK)
    d64 = tl.where(live, dst, 0).to(tl.int64)
    k = tl.load(SK + i.to(tl.int64) * stride_sk + offs, mask=m)
    v = tl.load(SV + i.to(tl.int64) * stride_sv + offs, mask=m)
    if QUANT:
        k = dequant(k.to(tl.int32), tl.load(SKS + i), OUT_BF16)
        v = dequant(v.to(tl.int32), tl.load(SVS + i), OUT_BF16)
    tl.store(KS + d64 * stride_ks + offs, k, mask=m)
    tl.store(VS + d64 * stride_vs + offs, v, mask=m)


def scatter_slots(stage_k, stage_v, dst_slot, k_slots, v_slots, scales=None):
    """Copy staged block i (``stage_k/v[i]: [block_size, D]`` on the GPU) into slot ``dst_slot[i]`` (-1 = skip).

    stage_k, stage_v: [C, block_size, D]; dst_slot: [C] int32 on the same device (fixed capacity, -1 padded).
    ``scales``: ``(stage_k_scale, stage_v_scale)`` [C] float32 when the staged rows are float8_e4m3fn codes (an fp8
    host pool): the slots get them dequantized, in their own dtype.
    """
    C, BS, D = stage_k.shape
    dev = k_slots.device
    quant = scales is not None
    stage_dtype = torch.float8_e4m3fn if quant else k_slots.dtype
    check(stage_k, "stage_k", (C, BS, D), stage_dtype, dev, inner_contiguous=2)
    check(stage_v, "stage_v", (C, BS, D), stage_dtype, dev, inner_contiguous=2)
    n_slots = k_slots.shape[0]
    check(k_slots, "k_slots", (n_slots, BS, D), None, dev, inner_contiguous=2)
    check(v_slots, "v_slots", (n_slots, BS, D), k_slots.dtype, dev, inner_contiguous=2)
    check(dst_slot, "dst_slot", (C,), torch.int32, dev)
    if quant:
        for name, t in zip(("stage_k_scale", "stage_v_scale"), scales):
            check(t, name, (C,), torch.float32, dev)
    if C == 0:
        return
    sk, sv = (stage_k.view(torch.uint8), stage_v.view(torch.uint8)) if quant else (stage_k, stage_v)
    scatter_slots_kernel[(C,)](
        sk,
        sv,
        dst_slot,
        k_slots,
        v_slots,
        scales[0] if quant else dst_slot,
        scales[1] if quant else dst_slot,
        stage_k.stride(0),
        stage_v.stride(0),
        k_slots.stride(0),
        v_slots.stride(0),
        CHUNK=BS * D,
        QUANT=quant,
        OUT_BF16=k_slots.dtype == torch.bfloat16,
        num_warps=4,
    )


def _init_intra_threads(n: int) -> None:
    torch.set_num_threads(n)
    torch.zeros(64, 4).index_select(0, torch.zeros(64, dtype=torch.int64))  # at::parallel_for: lazy thread init


def gather_thread(n_threads: int) -> ThreadPoolExecutor:
    """A one-thread executor whose thread has ``n_threads`` torch intra-op (OpenMP) threads of its own.

    ``torch.set_num_threads`` sets the calling thread's count and also the default that threads torch has not yet
    initialised adopt; the new thread sets its own, runs one parallel op so it is initialised with it, and the caller
    then puts the default back (its own count is unchanged)."""
    prev = torch.get_num_threads()
    ex = ThreadPoolExecutor(max_workers=1, initializer=_init_intra_threads, initargs=(n_threads,))
    ex.submit(lambda: None).result()
    torch.set_num_threads(prev)
    return ex


def host_gather_stage(host_k, host_v, src_block, src_head, stage_k, stage_v, flat=None, scales=None, stage_scales=None):
    """CPU gather of ``n`` (block, head) pairs into ``stage_k/v[:n]`` (pinned, host side). Returns n.

    host_k, host_v: [n_host_blocks, Hkv, block_size, D] contiguous; src_block, src_head: [n] int32/int64 CPU
    tensors, all valid (>= 0); or ``flat``: [n] int32/int64, the row ``block * Hkv + head`` of the
    ``[n_host_blocks * Hkv, block_size * D]`` view, already computed (then src_block/src_head may be None);
    stage_k, stage_v: [C >= n, block_size, D] contiguous CPU tensors.

    One ``index_select`` per tensor over the flat view (a parallel memcpy of 4 KiB rows inside ATen, on the calling
    thread's torch intra-op threads: ``gather_thread`` makes a dedicated thread with its own count). No Python thread
    pool and as few torch calls as possible: each call releases and re-takes the GIL, and with the main thread busy
    launching kernels every re-take can wait for Python's switch interval (5 ms). That, not memory bandwidth, made
    the old version (a Python pool of chunked ``index_select`` calls) slow beside a running step
    (experiments/transfer_paths/results/host_gather_cpu.md).

    An fp8 pool: ``scales`` ``(k_scale, v_scale)`` [n_host_blocks, Hkv] float32 and ``stage_scales`` (two [C]
    float32 tensors) take the rows' scales beside their codes (the rows are copied as bytes).
    """
    nb, Hkv, BS, D = host_k.shape
    assert host_k.is_contiguous() and host_v.is_contiguous(), "host pool must be contiguous"
    assert stage_k.is_contiguous() and stage_v.is_contiguous(), "staging buffers must be contiguous"
    if flat is None:
        assert src_block.device.type == "cpu" and src_head.device.type == "cpu", "host gather needs CPU indices"
        n = src_block.shape[0]
        if n == 0:
            return 0
        flat = torch.addcmul(src_head.long(), src_block.long(), torch.tensor(Hkv, dtype=torch.int64))
    else:
        assert flat.device.type == "cpu", "host gather needs CPU indices"
        n = flat.shape[0]
        if n == 0:
            return 0
    assert stage_k.shape[0] >= n, f"staging capacity {stage_k.shape[0]} < {n} blocks"
    W = BS * D
    if scales is not None:  # codes as bytes; index_select of float8 is not needed
        host_k, host_v = host_k.view(torch.uint8), host_v.view(torch.uint8)
        stage_k, stage_v = stage_k.view(torch.uint8), stage_v.view(torch.uint8)
        for sc, out in zip(scales, stage_scales):
            torch.index_select(sc.view(nb * Hkv), 0, flat, out=out[:n])
    torch.index_select(host_k.view(nb * Hkv, W), 0, flat, out=stage_k.view(-1, W)[:n])
    torch.index_select(host_v.view(nb * Hkv, W), 0, flat, out=stage_v.view(-1, W)[:n])
    return n


class HostStager:
    """Path 2's buffers: pinned host staging, GPU staging, and the gather thread (one per layer pipeline).

    ``gather(...)`` fills the host staging (blocking); ``upload(n)`` issues the two DMAs on the current stream;
    ``scatter(dst_slot, k_slots, v_slots)`` writes slots. Do not call ``gather`` again before the previous ``upload``
    has completed on the GPU (record an event after it and wait on it).

    n_threads: with an int, ``gather`` runs on a dedicated thread holding that many torch intra-op threads (the
    caller's own thread count is left alone); with ``None`` it runs inline on the calling thread, on whatever
    intra-op threads that thread has (the pipeline's host worker, itself a ``gather_thread``).
    """

    def __init__(
        self, capacity, block_size, head_dim, dtype=torch.bfloat16, device="cuda", n_threads=8, quantized=False
    ):
        """``dtype``: the slots'; ``quantized`` (an fp8 pool): the staging holds float8_e4m3fn codes and a float32
        scale per row (``stage_ks`` / ``stage_vs``, ``gpu_ks`` / ``gpu_vs``), DMA'd beside them and dequantized by the
        scatter."""
        pin = torch.device(device).type == "cuda"
        shape = (capacity, block_size, head_dim)
        self.quantized = quantized
        sdt = torch.float8_e4m3fn if quantized else dtype
        self.stage_k = torch.empty(shape, dtype=sdt, pin_memory=pin)
        self.stage_v = torch.empty(shape, dtype=sdt, pin_memory=pin)
        self.gpu_k = torch.empty(shape, dtype=sdt, device=device)
        self.gpu_v = torch.empty(shape, dtype=sdt, device=device)
        self.stage_ks = self.stage_vs = self.gpu_ks = self.gpu_vs = None
        if quantized:
            self.stage_ks = torch.ones(capacity, dtype=torch.float32, pin_memory=pin)
            self.stage_vs = torch.ones(capacity, dtype=torch.float32, pin_memory=pin)
            self.gpu_ks = torch.ones(capacity, dtype=torch.float32, device=device)
            self.gpu_vs = torch.ones(capacity, dtype=torch.float32, device=device)
        self.n_threads = n_threads
        self.pool = None
        if n_threads is not None:
            self.pool = gather_thread(n_threads)

    def gather(self, host_k, host_v, src_block, src_head, flat=None, scales=None) -> int:
        """``scales``: the fp8 pool's ``(k_scale, v_scale)`` (a quantized stager needs them)."""
        assert (scales is not None) == self.quantized, "an fp8 pool's scales go with a quantized stager"
        stage_sc = (self.stage_ks, self.stage_vs) if self.quantized else None
        args = (host_k, host_v, src_block, src_head, self.stage_k, self.stage_v, flat, scales, stage_sc)
        if self.pool is None:
            return host_gather_stage(*args)
        return self.pool.submit(host_gather_stage, *args).result()

    def upload(self, n: int):
        if n:
            self.gpu_k[:n].copy_(self.stage_k[:n], non_blocking=True)
            self.gpu_v[:n].copy_(self.stage_v[:n], non_blocking=True)
            if self.quantized:
                self.gpu_ks[:n].copy_(self.stage_ks[:n], non_blocking=True)
                self.gpu_vs[:n].copy_(self.stage_vs[:n], non_blocking=True)

    def scatter(self, dst_slot, k_slots, v_slots):
        """dst_slot: [capacity] int32 on the GPU, -1 past the staged prefix."""
        sc = (self.gpu_ks, self.gpu_vs) if self.quantized else None
        scatter_slots(self.gpu_k, self.gpu_v, dst_slot, k_slots, v_slots, scales=sc)

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()


def copy_list(fetch_block, fetch_slot, n_kv_heads, host_table=None):
    """Flatten a layer's plan into the gather's copy list, without a host sync.

    fetch_block, fetch_slot: [R, C] (R = B * Hkv rows, row = b * Hkv + h; host logical block ids / slots, -1 pad).
    host_table: [B, max_blocks] (optional) maps request b's logical block to its host-pool block; without it the
    logical id is the pool index. Returns ``(src_block, src_head, dst_slot)``, each [R * C] int32.
    """
    R, C = fetch_block.shape
    rows = torch.arange(R, device=fetch_block.device)
    head = (rows % n_kv_heads)[:, None].expand(R, C)
    live = (fetch_block >= 0) & (fetch_slot >= 0)
    blk = fetch_block.long().clamp(min=0)
    if host_table is not None:
        req = (rows // n_kv_heads)[:, None].expand(R, C)
        blk = host_table.long()[req, blk]
    src_block = torch.where(live, blk, -1).to(torch.int32).reshape(-1)
    dst = torch.where(live, fetch_slot.long(), -1).to(torch.int32).reshape(-1)
    return src_block, head.to(torch.int32).reshape(-1), dst


def gather_ref(host_k, host_v, src_block, src_head, dst_slot, k_slots, v_slots, count=None, scales=None):
    """Plain-torch reference, in place: slot[dst] = pool[src_block, src_head] for the live items (an fp8 pool with
    ``scales``: dequantized, ``q * scale`` in the slots' dtype)."""
    n = src_block.shape[0] if count is None else min(int(count[0]), src_block.shape[0])
    for i in range(n):
        b, h, d = int(src_block[i]), int(src_head[i]), int(dst_slot[i])
        if b >= 0 and d >= 0:
            k, v = host_k[b, h], host_v[b, h]
            if scales is not None:
                k = (k.float() * scales[0][b, h].float()).to(k_slots.dtype)
                v = (v.float() * scales[1][b, h].float()).to(v_slots.dtype)
            k_slots[d] = k.to(k_slots.device)
            v_slots[d] = v.to(v_slots.device)


def _bench_setup(n_items, pool_gb, n_kv_heads, block_size, head_dim, seed):
    torch.manual_seed(seed)
    n_host = max(n_items, int(pool_gb * 2**30 / (2 * n_kv_heads * block_size * head_dim * 2)))
    host_k = torch.empty(n_host, n_kv_heads, block_size, head_dim, dtype=torch.bfloat16, pin_memory=True)
    host_v = torch.empty_like(host_k, pin_memory=True)
    n_slots = n_items + 16
    k_slots = torch.empty(n_slots, block_size, head_dim, dtype=torch.bfloat16, device="cuda")
    v_slots = torch.empty_like(k_slots)
    src_block = torch.randint(0, n_host, (n_items,), dtype=torch.int32)
    src_head = torch.randint(0, n_kv_heads, (n_items,), dtype=torch.int32)
    dst_slot = torch.randperm(n_slots)[:n_items].to(torch.int32)
    i = n_items // 2  # the item the benchmark checks: give it known contents (the rest of the pool is uninitialised)
    host_k[int(src_block[i]), int(src_head[i])].normal_()
    host_v[int(src_block[i]), int(src_head[i])].normal_()
    return host_k, host_v, k_slots, v_slots, src_block, src_head, dst_slot


def bench_gather(
    n_items=4096,
    pool_gb=4.0,
    n_kv_heads=8,
    block_size=16,
    head_dim=128,
    n_programs=16,
    items_per_iter=2,
    num_warps=4,
    n_threads=8,
    seed=0,
):
    """GB/s of both paths (K + V bytes moved), against the 55.3 GB/s pinned DMA rate; alone, not beside compute."""
    from triton.testing import do_bench

    host_k, host_v, k_slots, v_slots, sb, sh, ds = _bench_setup(
        n_items, pool_gb, n_kv_heads, block_size, head_dim, seed
    )
    dev = k_slots.device
    sb_g, sh_g, ds_g = sb.to(dev), sh.to(dev), ds.to(dev)
    nbytes = n_items * block_size * head_dim * 2 * 2
    uva = lambda: uva_gather(
        host_k,
        host_v,
        sb_g,
        sh_g,
        ds_g,
        k_slots,
        v_slots,
        n_programs=n_programs,
        items_per_iter=items_per_iter,
        num_warps=num_warps,
    )
    uva()
    torch.cuda.synchronize()
    i = n_items // 2
    ok_uva = torch.equal(k_slots[int(ds[i])].cpu(), host_k[int(sb[i]), int(sh[i])])
    ms_uva = do_bench(uva, warmup=5, rep=100)
    stager = HostStager(n_items, block_size, head_dim, device=dev, n_threads=n_threads)

    def staged():
        n = stager.gather(host_k, host_v, sb, sh)
        stager.upload(n)
        stager.scatter(ds_g, k_slots, v_slots)

    staged()
    torch.cuda.synchronize()
    ok_staged = torch.equal(v_slots[int(ds[i])].cpu(), host_v[int(sb[i]), int(sh[i])])
    ms_staged = do_bench(staged, warmup=5, rep=100)
    stager.close()
    res = []
    for path, ms, ok in (("uva_persistent", ms_uva, ok_uva), ("host_stage_dma", ms_staged, ok_staged)):
        gbps = nbytes / ms / 1e6
        res.append(
            dict(
                kernel="gather",
                path=path,
                n_items=n_items,
                n_programs=n_programs,
                n_threads=n_threads,
                ms=ms,
                bytes=nbytes,
                gbps=gbps,
                roofline_gbps=H2D_ROOFLINE_GBPS,
                frac_roofline=gbps / H2D_ROOFLINE_GBPS,
                correct=bool(ok),
            )
        )
    return res
