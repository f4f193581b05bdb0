"""The copy engines fed a host-made list: how fast do they gather a step's pieces from pinned host memory, by piece
size, alone and beside an HBM-bound load (issue 17, "fewer bytes per step": K and V of a (block, head) contiguous)?

    python experiments/transfer_paths/ce_batch_pieces.py --out FILE.json [--pieces-kib 4,8,16,32,64]
        [--step-mb 622.9] [--layers 36] [--pool-gb 8] [--dry-run]

One decode pass at 16K x 44 (bf16, fetch 0.05) moves 622.9 MB in 36 layers: today as 4 KiB rows (K and V of a
(block, head) apart), gathered by the UVA kernel on 16 programs at 45-46 GB/s beside the step (50.7 alone). The
copy engines move 53-54 GB/s for large pieces, but only from lists the host makes. This asks what they do with
pieces of 4-64 KiB from random places in a pinned pool, one ``cuMemcpyBatchAsync`` a layer (36 a pass), and what
the host pays to submit them: if 8 KiB pieces (K and V of a (block, head) contiguous) stay near 4 KiB's rate, a host-
list path cannot lift the 16K cap; if they reach the large-piece rate, it can.

Per piece size: the host's submit time for the pass, the GPU time of the 36 batches alone (events), and beside a
load of bf16 GEMMs (``[64, 4096] x [4096, 16384]``, HBM-bound like the step's weight reads) on the main stream. Each
batch's content is checked against the pool. References in the same process: one contiguous copy a layer (the
copy engine's large-piece rate) and the UVA gather (``oasis_kernels.gather.uva_gather``, 16 programs) of the same bytes as
8 KiB (block, head) items. One JSON file with every row and the device, date and commit.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


class _MemLoc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttrs(ctypes.Structure):  # CUmemcpyAttributes (cuda.h, CUDA >= 12.8)
    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLoc),
        ("dstLocHint", _MemLoc),
        ("flags", ctypes.c_uint),
    ]


_ORDER_STREAM, _LOC_DEVICE, _LOC_HOST, _PREFER_OVERLAP = 1, 1, 2, 1


class BatchCopy:
    """``cuMemcpyBatchAsync`` through ctypes: the CUDA 13 entry (no failure index) or 12.8's."""

    def __init__(self, device: int, prefer_overlap: bool):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.v2 = hasattr(self.cu, "cuMemcpyBatchAsync_v2")
        self.fn = self.cu.cuMemcpyBatchAsync_v2 if self.v2 else self.cu.cuMemcpyBatchAsync
        flags = _PREFER_OVERLAP if prefer_overlap else 0
        self.attrs = _MemcpyAttrs(_ORDER_STREAM, _MemLoc(_LOC_HOST, 0), _MemLoc(_LOC_DEVICE, device), flags)
        self.idx = (ctypes.c_size_t * 1)(0)
        self.fail = ctypes.c_size_t(0)

    def __call__(self, dsts, srcs, sizes, stream_handle: int) -> None:
        """dsts, srcs, sizes: numpy uint64 arrays of one batch."""
        n = len(sizes)
        p = ctypes.c_void_p
        args = [p(dsts.ctypes.data), p(srcs.ctypes.data), p(sizes.ctypes.data), ctypes.c_size_t(n)]
        args += [ctypes.byref(self.attrs), self.idx, ctypes.c_size_t(1)]
        if not self.v2:
            args.append(ctypes.byref(self.fail))
        rc = self.fn(*args, p(stream_handle))
        if rc != 0:
            msg = ctypes.c_char_p()
            self.cu.cuGetErrorString(rc, ctypes.byref(msg))
            raise RuntimeError(f"cuMemcpyBatchAsync: {rc} {msg.value.decode() if msg.value else ''}")


def ints(s):
    return [int(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pieces-kib", type=ints, default=[4, 8, 16, 32, 64])
    ap.add_argument("--step-mb", type=float, default=622.9, help="bytes of one pass (16K x 44, bf16, fetch 0.05)")
    ap.add_argument("--layers", type=int, default=36, help="one batch a layer")
    ap.add_argument("--pool-gb", type=float, default=8.0, help="the pinned pool the pieces come from (past L3)")
    ap.add_argument("--gemms", type=int, default=320, help="GEMMs of the load beside the copies")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    layer_b = int(a.step_mb * 1e6 / a.layers)
    print(f"{a.layers} batches of {layer_b / 1e6:.2f} MB; pieces {a.pieces_kib} KiB; pool {a.pool_gb} GB")
    if a.dry_run:
        return 0
    import numpy as np
    import torch

    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    pool = torch.empty(int(a.pool_gb * 2**30), dtype=torch.uint8, pin_memory=True)
    pool.view(torch.int64)[::512].copy_(torch.arange(0, pool.numel() // 8, 512))  # a mark every 4 KiB
    dst = torch.empty(layer_b * a.layers, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream()
    x = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
    ws = [torch.randn(4096, 16384, device=dev, dtype=torch.bfloat16) for _ in range(4)]

    def load():
        for j in range(a.gemms):
            x @ ws[j % 4]

    def timed(fn, beside):
        """(host submit s, GPU ms of the copies' stream span or of both streams, beside) median over reps."""
        subs, gpus = [], []
        for _ in range(a.reps + 1):
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            side.wait_stream(torch.cuda.current_stream())
            if beside:
                load()
            t0 = time.perf_counter()
            with torch.cuda.stream(side):
                fn()
            subs.append(time.perf_counter() - t0)
            torch.cuda.current_stream().wait_stream(side)
            e1.record()
            torch.cuda.synchronize()
            gpus.append(e0.elapsed_time(e1))
        return float(np.median(subs[1:])), float(np.median(gpus[1:]))

    _, load_ms = timed(lambda: None, True)
    rows = []
    bc = BatchCopy(dev.index or 0, prefer_overlap=False)
    bco = BatchCopy(dev.index or 0, prefer_overlap=True)
    for kib in a.pieces_kib:
        p = kib * 1024
        n = layer_b // p
        slots = pool.numel() // p
        lists = []
        for li in range(a.layers):
            src_i = rng.choice(slots, size=n, replace=False).astype(np.uint64)
            srcs = np.uint64(pool.data_ptr()) + src_i * np.uint64(p)
            dsts = np.uint64(dst.data_ptr() + li * layer_b) + np.arange(n, dtype=np.uint64) * np.uint64(p)
            lists.append((dsts, srcs, np.full(n, p, dtype=np.uint64), src_i))
        for name, copier in (("batch", bc), ("batch_prefer_overlap", bco)):

            def run(copier=copier, lists=lists):
                h = side.cuda_stream
                for d, s, z, _ in lists:
                    copier(d, s, z, h)

            row = dict(kind=name, piece_kib=kib, pieces_per_batch=n, batches=a.layers)
            try:
                dst.zero_()
                run()
                torch.cuda.synchronize()
                d, _, _, si = lists[-1]
                j = n // 2
                want = pool[int(si[j]) * p : int(si[j]) * p + p]
                got = dst[(a.layers - 1) * layer_b + j * p : (a.layers - 1) * layer_b + (j + 1) * p].cpu()
                row["correct"] = bool(torch.equal(want, got))
                sub, ms = timed(run, False)
                sub_b, ms_b = timed(run, True)
                nb = n * p * a.layers
                row.update(
                    submit_ms=sub * 1e3,
                    submit_us_per_piece=sub * 1e6 / (n * a.layers),
                    alone_ms=ms,
                    alone_gb_s=nb / ms / 1e6,
                    together_ms=ms_b,
                    load_ms=load_ms,
                    beside_gb_s=nb / max(ms_b - load_ms, 1e-9) / 1e6 if ms_b > load_ms else None,
                    hidden=(ms + load_ms - ms_b) / min(ms, load_ms),
                )
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)

    # references: one contiguous copy a layer; the UVA gather of the same bytes as 8 KiB (block, head) items
    src_big = pool[: layer_b * a.layers].view(a.layers, layer_b)

    def contiguous():
        for li in range(a.layers):
            dst[li * layer_b : (li + 1) * layer_b].copy_(src_big[li], non_blocking=True)

    sub, ms = timed(contiguous, False)
    sub_b, ms_b = timed(contiguous, True)
    nb = layer_b * a.layers
    row = dict(kind="contiguous", piece_kib=layer_b // 1024, submit_ms=sub * 1e3, alone_ms=ms, alone_gb_s=nb / ms / 1e6)
    row.update(
        together_ms=ms_b, load_ms=load_ms, beside_gb_s=nb / max(ms_b - load_ms, 1e-9) / 1e6 if ms_b > load_ms else None
    )
    rows.append(row)
    print(json.dumps(row), flush=True)
    pool = src_big = None  # unpinned before the UVA reference pins its own pool (src_big, a view, kept it alive)
    try:
        import oasis_kernels  # noqa: F401
        from oasis_kernels.gather import _bench_setup, uva_gather

        items = layer_b // 8192
        hk, hv, ks, vs, sb, sh, ds = _bench_setup(items, min(a.pool_gb, 8.0), 8, 16, 128, 0)
        sb_g, sh_g, ds_g = sb.to(dev), sh.to(dev), ds.to(dev)

        def uva():
            for _ in range(a.layers):
                uva_gather(hk, hv, sb_g, sh_g, ds_g, ks, vs, n_programs=16, items_per_iter=2)

        sub, ms = timed(uva, False)
        sub_b, ms_b = timed(uva, True)
        nb = items * 8192 * a.layers
        row = dict(kind="uva_gather_16", piece_kib=4, items_per_layer=items, submit_ms=sub * 1e3, alone_ms=ms)
        row.update(alone_gb_s=nb / ms / 1e6, together_ms=ms_b, load_ms=load_ms)
        row.update(beside_gb_s=nb / max(ms_b - load_ms, 1e-9) / 1e6 if ms_b > load_ms else None)
        row.update(hidden=(ms + load_ms - ms_b) / min(ms, load_ms))
    except Exception as e:
        row = dict(kind="uva_gather_16", error=f"{type(e).__name__}: {e}"[:300])
    rows.append(row)
    print(json.dumps(row), flush=True)
    rec = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=os.environ.get("OASIS_COMMIT", "unknown"),
        driver_entry="cuMemcpyBatchAsync_v2" if bc.v2 else "cuMemcpyBatchAsync",
        step_bytes=layer_b * a.layers,
        layers=a.layers,
        gemms=a.gemms,
        load_ms=load_ms,
        rows=rows,
    )
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
