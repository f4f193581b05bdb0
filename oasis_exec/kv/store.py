"""KV storage: the pinned host pool, the sparse GPU working set, and the paged dense GPU cache.

Layouts (``bs`` = block size, ``D`` = head dim, ``H`` = KV heads, ``L`` layers), chosen to match ``oasis_kernels/``:

- ``HostPool.k[l]`` / ``.v[l]``: [N_host, H, bs, D] per layer, pinned. One (layer, block, KV head) of K, and of V, is one
  contiguous run of bs * D elements (4 KiB at 16 x 128 bf16), so a fetch is two contiguous reads. Host block ids
  are allocated by the scheduler (torch-free) and handed over per request as a block table. With
  ``ExecConfig.host_kv_dtype="fp8_e4m3"`` the elements are float8_e4m3fn (2 KiB a run) and ``k_scale[l]`` /
  ``v_scale[l]``: [N_host, H] float32 hold each run's scale (``oasis_exec.kv.host_quant``), in the same pinned piece.
- ``SparseStore.k[l]`` / ``.v[l]``: [B_max * H * (S + 2), bs, D] per layer: the slot pool of ``oasis_kernels.sparse_attn``.
  Row (lane, head) owns slots ``(lane * H + head) * (S + 2) + s``: ``s < S`` the selectable working set,
  ``LOCAL = S`` the newest (partial) block, ``TRASH = S + 1`` absorbs padded writes of fixed-shape copies.
  ``S = top_k``, except in hisparse, where the working set is a hot cache of ``S = hot_slots >= top_k`` slots
  (``ExecConfig.resident_slots``) and attention reads only the step's top-K of them (``selected_slots``).
- ``SparseStore.resident`` / ``last_sel``: [L, B_max * H, S] int64, the per-head mapping (slot -> host logical
  block of the request, -1 empty), in the form ``oasis_core.selection.plan_step`` takes and returns.
- ``kmin`` / ``kmax``: [L, B_max, H, NB_max, D] block summaries (Quest min/max) of every block of every context;
  blocks not yet full hold +inf / -inf. With ``block_score=tokens`` they are None and ``tok``
  (``oasis_exec.kv.token_summaries``) holds every token's kept key channels instead.
- A hybrid model's sliding-window layers keep a ring (``oasis_exec.kv.ring``) and none of the above: their slot and
  page arrays are empty, and the tables and summaries are held for the full layers only (``layers``;
  ``oasis_exec.kv.layer_table.FullLayers``, indexed by the model's layer like the ``[L, ...]`` tensor).
- ``DenseStore.k[l]`` / ``.v[l]``: [B_max * P, H, bs, D] pages (``oasis_kernels.paged_attn``); lane b owns pages
  ``b * P .. b * P + P - 1`` (P = blocks of the longest context), so its block table is fixed.
"""

from __future__ import annotations

import math

import torch

from oasis_core import lanes

from .layer_table import table

# -- exact-size pinned host memory ----------------------------------------------------------------------------
# ``torch.empty(..., pin_memory=True)`` goes through PyTorch's caching host allocator, which rounds every request up
# to the next power of two: a 48.5 GB piece takes 64 GiB, and 72 per-layer pieces of 1.35 GB (40 requests at 16K)
# take 72 x 2 GiB = 155 GB -- more than this 128 GiB machine has. That rounding, not the driver, refused the H200
# runs' pools. So the pool is pageable memory of exactly the size needed, page-locked with ``cudaHostRegister``
# (mapped: the UVA gather reads it through its host pointer). Registration costs about as much as the pinning did
# (the guest's memory grows at ~2.7 GB/s on the lent machine), so the registered pieces are kept for the life of
# the process and reused by the next pool that fits in them (a benchmark that runs several configurations in one
# process pins its largest pool once).

_PINNED = {"pieces": [], "piece_bytes": 0}  # registered flat uint8 buffers, kept for reuse


def _cuda_register(ptr: int, nbytes: int) -> int:
    err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 3)  # cudaHostRegisterPortable | Mapped
    return int(getattr(err, "value", err))


def _cuda_unregister(ptr: int) -> int:
    err = torch.cuda.cudart().cudaHostUnregister(ptr)
    return int(getattr(err, "value", err))


def _cudart_libs() -> list:
    """ctypes handles of the CUDA runtime(s) this process has loaded (torch's)."""
    import ctypes

    with open("/proc/self/maps") as f:
        libs = sorted({ln.split()[-1] for ln in f if "libcudart" in ln})
    return [ctypes.CDLL(lib) for lib in libs]


def _clear_cuda_error() -> None:
    """Reset the runtime's last error after a refused registration (else the next kernel launch check raises it)."""
    try:
        for lib in _cudart_libs():
            lib.cudaGetLastError()
    except Exception:
        pass


def _same_device_pointer(ptr: int) -> bool:
    """Whether the GPU reaches registered memory at its host address (the UVA gather passes the host pointer)."""
    try:
        import ctypes

        for lib in _cudart_libs():
            dptr = ctypes.c_void_p()
            if lib.cudaHostGetDevicePointer(ctypes.byref(dptr), ctypes.c_void_p(ptr), 0) == 0:
                return dptr.value == ptr
    except Exception:
        pass
    return True  # unknown: cudaDevAttrCanUseHostPointerForRegisteredMem is 1 on x86-64 Linux


def release_pinned() -> None:
    """Unregister and drop the kept pinned pieces (views still alive become pageable memory)."""
    for t in _PINNED["pieces"]:
        _cuda_unregister(t.data_ptr())
    _PINNED["pieces"], _PINNED["piece_bytes"] = [], 0


def pinned_pieces(n: int, nbytes: int) -> list:
    """``n`` page-locked flat uint8 tensors of ``nbytes`` each (exact size), reusing the kept ones when they fit."""
    kept = _PINNED["pieces"]
    if len(kept) >= n and _PINNED["piece_bytes"] >= nbytes:
        return [t[:nbytes] for t in kept[:n]]
    release_pinned()  # free the smaller pieces first: host memory, not address space, is what binds
    pieces = []
    for i in range(n):
        t = torch.empty(nbytes, dtype=torch.uint8)
        rc = _cuda_register(t.data_ptr(), nbytes) if nbytes else 0
        if rc != 0:
            for p in pieces:
                _cuda_unregister(p.data_ptr())
            del pieces, t
            _clear_cuda_error()
            raise RuntimeError(
                f"cudaHostRegister refused piece {i + 1} of {n} ({nbytes / 1e9:.2f} GB each, "
                f"{i * nbytes / 1e9:.1f} GB already pinned): error {rc}"
            )
        pieces.append(t)
        if i == 0 and nbytes and not _same_device_pointer(t.data_ptr()):
            _cuda_unregister(t.data_ptr())  # the GPU would need another address: use PyTorch's pinned allocator
            pieces = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
            _PINNED["pieces"], _PINNED["piece_bytes"] = [], 0
            return pieces
    _PINNED["pieces"], _PINNED["piece_bytes"] = pieces, nbytes
    return pieces


class HostPool:
    """The full KV cache of every admitted request, in (pinned, when CUDA is present) host memory.

    ``k[l]`` / ``v[l]``: [N_host, H, bs, D], one tensor per layer, each its own exact-size page-locked piece
    (``pinned_pieces``; see the note above on why not ``pin_memory=True``). ``dtype``: the compute dtype, what
    ``read`` returns and ``write`` takes. ``quantized`` (``host_kv_dtype="fp8_e4m3"``): ``k[l]`` / ``v[l]`` are
    float8_e4m3fn and ``k_scale[l]`` / ``v_scale[l]`` [N_host, H] float32 their per-(block, head) scales, placed after
    the codes in the same piece (64-byte aligned); else ``k_scale`` / ``v_scale`` are None.
    """

    def __init__(
        self, n_layers, n_blocks, n_kv_heads, block_size, head_dim, dtype, pin, quantized: bool = False, layers=None
    ):
        # layers: those with a host copy (None: all); a sliding-window layer has none (oasis_exec.kv.ring): its
        # arrays are empty
        held = list(range(n_layers) if layers is None else layers)
        shape = (n_blocks, n_kv_heads, block_size, head_dim)
        self.dtype, self.quantized = dtype, quantized
        self.block_size, self.head_dim = block_size, head_dim
        store = dtype
        if quantized:
            from .host_quant import fp8_dtype

            store = fp8_dtype()
        self.storage_dtype = store
        data = math.prod(shape) * torch.tensor([], dtype=store).element_size()
        off = -(-data // 64) * 64  # the scales after the codes, aligned
        nbytes = off + n_blocks * n_kv_heads * 4 if quantized else data
        if pin:
            flat = pinned_pieces(2 * len(held), nbytes)
        else:
            flat = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(2 * len(held))]
        at = {l: i for i, l in enumerate(held)}

        def per_layer(views, empty):  # [k of each layer], [v of each layer]; empty where a layer has no copy
            return [[views[2 * at[l] + kv] if l in at else empty for l in range(n_layers)] for kv in (0, 1)]

        views = [f[:data].view(store).view(shape) for f in flat]
        self.k, self.v = per_layer(views, torch.empty((0, *shape[1:]), dtype=store))
        self.k_scale = self.v_scale = None
        if quantized:
            sc = [f[off:nbytes].view(torch.float32).view(n_blocks, n_kv_heads) for f in flat]
            for t in sc:  # 0.2% of the pool: finite scales even in a pool left unwritten (bench --no-host-fill)
                t.fill_(1.0)
            self.k_scale, self.v_scale = per_layer(sc, torch.empty((0, n_kv_heads)))
        self.n_blocks = n_blocks

    @property
    def nbytes(self) -> int:
        """Host bytes of the pool: K and V of every layer, and their scales when quantized."""
        t = self.k + self.v + (self.k_scale + self.v_scale if self.quantized else [])
        return sum(x.numel() * x.element_size() for x in t)

    @property
    def unit_bytes(self) -> int:
        """Bytes one (layer, block, KV head) fetch reads from the pool: K and V (and their two scales)."""
        run = self.block_size * self.head_dim * self.k[0].element_size()
        return 2 * (run + (4 if self.quantized else 0))

    def write(self, layer: int, blocks, k, v) -> None:
        """Host copies of whole blocks: ``k`` / ``v`` [n, H, bs, D] in the compute dtype (any device) into host blocks
        ``blocks`` (n ids) of layer ``layer``, quantized first (on ``k``'s device) when the pool is fp8."""
        if self.quantized:
            from .host_quant import quantize

            (qk, sk), (qv, sv) = quantize(k), quantize(v)
            self.k[layer][blocks] = qk.to("cpu")
            self.v[layer][blocks] = qv.to("cpu")
            self.k_scale[layer][blocks] = sk.to("cpu")
            self.v_scale[layer][blocks] = sv.to("cpu")
            return
        self.k[layer][blocks] = k.to("cpu")
        self.v[layer][blocks] = v.to("cpu")

    def read(self, layer: int, blocks, heads, device=None) -> tuple:
        """The (block, head) units ``blocks[i], heads[i]`` (CPU index tensors) of layer ``layer`` in the compute dtype
        on ``device`` (default: the CPU): ``(k, v)``, each [n, bs, D]. An fp8 pool moves the codes and scales to
        ``device`` and dequantizes there."""
        dev = torch.device(device) if device is not None else torch.device("cpu")
        hk, hv = self.k[layer][blocks, heads], self.v[layer][blocks, heads]
        nb = dev.type != "cpu"
        if not self.quantized:
            return hk.to(dev, non_blocking=nb), hv.to(dev, non_blocking=nb)
        from .host_quant import dequantize

        sk, sv = self.k_scale[layer][blocks, heads], self.v_scale[layer][blocks, heads]
        return (
            dequantize(hk.to(dev, non_blocking=nb), sk.to(dev, non_blocking=nb), self.dtype),
            dequantize(hv.to(dev, non_blocking=nb), sv.to(dev, non_blocking=nb), self.dtype),
        )

    def fill_pattern(self, seed: int = 0, chunk: int = 1 << 24) -> None:
        """Fill with a repeated random pattern (benchmarks: synthesized prefill; values need only be non-zero). An
        fp8 pool gets codes of the pattern and scales of 1/64."""
        g = torch.Generator().manual_seed(seed)
        pat = None
        for t in self.k + self.v:
            flat = t.view(-1)
            if not flat.numel():  # a sliding-window layer of a hybrid model: no host copy
                continue
            if pat is None:
                pat = (torch.randn(min(flat.numel(), chunk), generator=g) * 0.5).to(flat.dtype)
            for off in range(0, flat.numel(), pat.numel()):
                n = min(pat.numel(), flat.numel() - off)
                flat[off : off + n].copy_(pat[:n])
        if self.quantized:
            for t in self.k_scale + self.v_scale:
                t.fill_(1 / 64)


class SparseStore:
    def __init__(
        self,
        n_layers,
        max_lanes,
        n_kv_heads,
        slots,
        block_size,
        head_dim,
        max_blocks,
        dtype,
        device,
        layers=None,
        tok=None,
    ):
        self.L, self.B, self.H, self.S, self.bs, self.D = n_layers, max_lanes, n_kv_heads, slots, block_size, head_dim
        self.W = slots + 2  # slots per row
        self.LOCAL, self.TRASH = slots, slots + 1
        self.NB = max_blocks
        n = max_lanes * n_kv_heads * self.W
        # layers: those with slots (None: all); a sliding-window layer keeps a ring instead (oasis_exec.kv.ring)
        held = set(range(n_layers) if layers is None else layers)
        self.k = [
            torch.zeros(n if l in held else 0, block_size, head_dim, dtype=dtype, device=device)
            for l in range(n_layers)
        ]
        self.v = [
            torch.zeros(n if l in held else 0, block_size, head_dim, dtype=dtype, device=device)
            for l in range(n_layers)
        ]
        rows = max_lanes * n_kv_heads
        # the tables and summaries of the layers with slots only (layer_table: indexed by the model's layer)
        self.layers = tuple(sorted(held))
        self.resident = table(n_layers, self.layers, (rows, slots), -1, torch.int64, device, "resident")
        self.last_sel = table(n_layers, self.layers, (rows, slots), -1, torch.int64, device, "last_sel")
        # the block summaries: min/max (or a two-vector scorer's), or the per-token scorer's ``tok`` in their place
        self.tok = tok  # oasis_exec.kv.token_summaries.TokenSummaries (block_score=tokens) or None
        self.kmin = self.kmax = None
        if tok is None:
            summ = (max_lanes, n_kv_heads, max_blocks, head_dim)
            self.kmin = table(n_layers, self.layers, summ, math.inf, dtype, device, "kmin")
            self.kmax = table(n_layers, self.layers, summ, -math.inf, dtype, device, "kmax")
        self.host_table = torch.zeros(max_lanes, max_blocks, dtype=torch.int64, device=device)

    @staticmethod
    def bytes_per_lane(geo, slots, max_blocks) -> int:
        """GPU bytes of one lane (``geo``: a ``KVGeometry``): its ``slots`` + local + trash blocks in every layer and
        KV head, the summaries of ``max_blocks`` blocks, and the int64 resident / last_sel tables. ``slots`` is the
        store's ``S``: ``top_k``, or hisparse's ``hot_slots`` (``ExecConfig.resident_slots``), so a larger hot cache
        holds fewer lanes in the same budget."""
        return lanes.sparse_lane_bytes(geo, slots, max_blocks)

    def selected_slots(self, layer, rows, pred, base):
        """The slots of the predicted blocks: int32 [B, H, K], ``base[b, h] + s`` where block ``pred[r, k]`` sits in
        slot ``s`` of row ``r`` (``resident[layer][rows]``), -1 where ``pred`` is padding or the block is not resident.
        For a hot cache (hisparse) whose attention reads the step's top-K, not every slot of the row: the list is
        built after the step's fetch, from the table it updated (an inverse map block -> slot per row, one scatter
        and one gather; no host sync). ``rows``: the layer's rows (slice or index), ``pred`` [R, K], ``base`` [B, H]
        (``slot_base``)."""
        res = self.resident[layer][rows]  # [R, S]
        R, S = res.shape
        nb = self.NB
        inv = torch.full((R, nb + 1), -1, dtype=torch.int32, device=res.device)  # block -> slot; column nb: none
        slot = torch.arange(S, dtype=torch.int32, device=res.device).expand(R, S)
        inv.scatter_(1, torch.where(res >= 0, res, nb), slot)
        inv[:, nb] = -1  # the empty slots' (and the padding's) column
        pred = pred.long()
        s = inv.gather(1, torch.where(pred >= 0, pred, nb))  # [R, K]
        B, H = base.shape
        s = s.view(B, H, -1)
        return torch.where(s >= 0, base[:, :, None].to(torch.int32) + s, -1).to(torch.int32)

    def slot_base(self, lanes):
        """[B, H] int64: first slot of each (lane, head) row."""
        h = torch.arange(self.H, device=lanes.device)
        return (lanes[:, None] * self.H + h) * self.W

    def reset_lane(self, lane: int, host_blocks) -> None:
        h = self.H
        self.resident[:, lane * h : (lane + 1) * h] = -1
        self.last_sel[:, lane * h : (lane + 1) * h] = -1
        reset_summaries(self, lane)
        hb = torch.as_tensor(list(host_blocks), dtype=torch.int64)
        self.host_table[lane, : hb.numel()] = hb.to(self.host_table.device)


class DenseStore:
    def __init__(
        self,
        n_layers,
        max_lanes,
        n_kv_heads,
        max_blocks,
        head_dim,
        block_size,
        dtype,
        device,
        summaries: bool,
        paged_layers=None,
        tok=None,
    ):
        self.L, self.B, self.H, self.P, self.D, self.bs = (
            n_layers,
            max_lanes,
            n_kv_heads,
            max_blocks,
            head_dim,
            block_size,
        )
        # paged_layers: the layers with pages (None: all); a sliding-window layer keeps its KV in a ring instead
        # (oasis_exec.kv.ring) and gets an empty page array
        paged = set(range(n_layers) if paged_layers is None else paged_layers)
        shape = (max_lanes * max_blocks, n_kv_heads, block_size, head_dim)
        none = (0, n_kv_heads, block_size, head_dim)
        self.k = [torch.zeros(shape if l in paged else none, dtype=dtype, device=device) for l in range(n_layers)]
        self.v = [torch.zeros(shape if l in paged else none, dtype=dtype, device=device) for l in range(n_layers)]
        self.block_table = (
            torch.arange(max_lanes, device=device)[:, None] * max_blocks + torch.arange(max_blocks, device=device)
        ).to(torch.int32)
        self.layers = tuple(sorted(paged))
        self.tok = tok if summaries else None  # block_score=tokens: its storage in place of kmin / kmax
        if summaries and tok is None:  # quest: the paged layers' summaries only (layer_table)
            summ = (max_lanes, n_kv_heads, max_blocks, head_dim)
            self.kmin = table(n_layers, self.layers, summ, math.inf, dtype, device, "kmin")
            self.kmax = table(n_layers, self.layers, summ, -math.inf, dtype, device, "kmax")
        else:
            self.kmin = self.kmax = None

    @staticmethod
    def bytes_per_lane(geo, max_blocks, summaries) -> int:
        """GPU bytes of one lane (``geo``: a ``KVGeometry``): the pages of ``max_blocks`` blocks, every layer and KV
        head, and (``summaries``, quest) their min/max key summaries."""
        return lanes.dense_lane_bytes(geo, max_blocks, summaries)

    def reset_lane(self, lane: int) -> None:
        reset_summaries(self, lane)


def reset_summaries(store, lane: int) -> None:
    """A lane's summaries emptied (min/max: +inf / -inf; the per-token scorer's: zeros) at admission."""
    if store.kmin is not None:
        store.kmin[:, lane] = math.inf
        store.kmax[:, lane] = -math.inf
    if store.tok is not None:
        store.tok.reset_lane(lane)
