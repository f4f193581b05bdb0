"""CPU benchmark of the host-side gather (``oasis_kernels.gather.host_gather_stage``): GB/s by thread count and block count.

    python -m oasis_kernels.bench_host_gather [--threads 1 2] [--blocks 256 768 4096 24576] [--pool-gb 2] [--out PATH]

K + V bytes moved per second, random (block, head) 4 KiB items (16 x 128 bf16) from a host pool of ``--pool-gb`` GiB
per tensor. Each repetition uses a fresh index set (sets rotate over ``--rotate-mb`` MiB of sources, default 1,024)
so the L3 cache does not serve repeats: a 64 MiB rotation, enough on the 32 MiB L3 of the CPU VM, let the H200 host's
300 MiB L3 serve them (125 GB/s "alone" at 16 threads on 2026-11-30 against 39 GB/s from DRAM,
``experiments/transfer_paths/host_dma_pipeline.py``). Two implementations:

- ``legacy``: the version before 2026-11-30 (a Python ``ThreadPoolExecutor`` of n threads, the rows split in n
  chunks, one ``index_select`` per chunk and tensor, torch intra-op threads left at the process default);
- ``flat``: the torch one (one ``index_select`` per tensor over the ``[n_host_blocks * Hkv, bs * D]`` view on a
  dedicated thread holding n torch intra-op threads: ``HostStager(n_threads=n).gather``);
- ``native``: the C one (``oasis_kernels.host_native``: compaction, both copies on n OpenMP threads and the slot list in
  one GIL-free call, on the calling thread), from the same flat rows.

and three conditions for the calling process: ``idle``; ``launcher`` (another Python thread runs a loop of tiny
torch ops, as the main thread does while it launches a decode step's kernels); ``python`` (another thread spins in
pure Python and holds the GIL except at switch intervals: the worst case). On a machine with few cores the second
thread also takes a core. CPU only; no GPU figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from oasis_core import provenance

from . import host_native
from ._util import cdiv
from .gather import HostStager

HKV, BS, D = 8, 16, 128


def legacy_host_gather_stage(host_k, host_v, src_block, src_head, stage_k, stage_v, pool=None, n_chunks=None):
    """The pre-2026-11-30 ``host_gather_stage``, verbatim (the "before" of the benchmark)."""
    nb, Hkv, BS, D = host_k.shape
    n = src_block.shape[0]
    if n == 0:
        return 0
    flat = src_block.long() * Hkv + src_head.long()
    hk, hv = host_k.view(nb * Hkv, BS * D), host_v.view(nb * Hkv, BS * D)
    sk, sv = stage_k.view(-1, BS * D), stage_v.view(-1, BS * D)

    def run(lo, hi):
        torch.index_select(hk, 0, flat[lo:hi], out=sk[lo:hi])
        torch.index_select(hv, 0, flat[lo:hi], out=sv[lo:hi])

    if pool is None:
        run(0, n)
        return n
    workers = n_chunks or getattr(pool, "_max_workers", 8)
    step = cdiv(n, workers)
    list(pool.map(lambda lo: run(lo, min(n, lo + step)), range(0, n, step)))
    return n


class Contender:
    """A second Python thread competing for the GIL (and a core) while the gather runs."""

    def __init__(self, kind):
        self.kind, self.stop, self.ops = kind, False, 0
        self.th = None if kind == "idle" else threading.Thread(target=self._run, daemon=True)

    def _run(self):
        x = torch.zeros(8)
        while not self.stop:
            if self.kind == "launcher":
                x.add_(1)  # a tiny op: the GIL is dropped and re-taken around it, like a kernel launch
            else:
                for _ in range(1000):
                    pass
            self.ops += 1

    def __enter__(self):
        if self.th is not None:
            self.th.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        if self.th is not None:
            self.th.join()


def _native(n, n_threads):
    """The native gather as the benchmark calls it: flat rows and slots built outside the timed call would hide
    their cost, so the rows are computed here as the pipeline's copy list has them (int32 block * Hkv + head)."""
    if not host_native.available():
        return None
    g = host_native.Gatherer(n, n_threads)
    dst = torch.arange(n, dtype=torch.int32)
    dst_out = torch.empty(n, dtype=torch.int32)

    def fn(host_k, host_v, sb, sh, stage_k, stage_v):
        flat = sb * HKV + sh
        return g.gather_rows(host_k, host_v, flat, dst, n, stage_k, stage_v, dst_out)

    return fn


def run(
    threads=(1, 2),
    blocks=(256, 768, 4096, 24576),
    pool_gb=2.0,
    conditions=("idle", "launcher", "python"),
    impls=("legacy", "flat"),
    min_s=0.6,
    seed=0,
    rotate_mb=1024,
):
    n_host = int(pool_gb * 2**30 / (HKV * BS * D * 2))
    host_k = torch.empty(n_host, HKV, BS, D, dtype=torch.bfloat16)
    host_v = torch.empty_like(host_k)
    host_k.fill_(1.0), host_v.fill_(2.0)  # touch every page
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in blocks:
        n_sets = max(4, cdiv(rotate_mb << 20, n * BS * D * 2 * 2))
        sets = [
            (
                torch.randint(0, n_host, (n,), generator=g, dtype=torch.int32),
                torch.randint(0, HKV, (n,), generator=g, dtype=torch.int32),
            )
            for _ in range(n_sets)
        ]
        nbytes = n * BS * D * 2 * 2
        for nt in threads:
            stager = HostStager(n, BS, D, device="cpu", n_threads=nt)
            pool = ThreadPoolExecutor(max_workers=nt) if nt > 1 else None
            nat = _native(n, nt)
            fns = {  # the loop's stager / nat / pool bound as defaults: each dict is used within its iteration
                "flat": lambda sb, sh, st=stager: st.gather(host_k, host_v, sb, sh),
                "native": lambda sb, sh, st=stager, f=nat: f(host_k, host_v, sb, sh, st.stage_k, st.stage_v),
                "legacy": lambda sb, sh, st=stager, p=pool: legacy_host_gather_stage(
                    host_k, host_v, sb, sh, st.stage_k, st.stage_v, p
                ),
            }
            for cond in conditions:
                for impl in impls:
                    fn = fns[impl]
                    if fn is None:
                        print(f"{impl}: not available (no C compiler)", flush=True)
                        continue
                    for sb, sh in sets[:2]:
                        fn(sb, sh)  # warm-up
                    ts = []
                    with Contender(cond):
                        t_end = time.perf_counter() + min_s
                        i = 0
                        while time.perf_counter() < t_end or len(ts) < 5:
                            sb, sh = sets[i % n_sets]
                            t0 = time.perf_counter()
                            fn(sb, sh)
                            ts.append(time.perf_counter() - t0)
                            i += 1
                    sb, sh = sets[(i - 1) % n_sets]
                    ok = torch.equal(stager.stage_v[n // 2], host_v[int(sb[n // 2]), int(sh[n // 2])])
                    ts.sort()
                    ms = 1e3 * ts[len(ts) // 2]
                    gbps = nbytes / ms / 1e6
                    rows.append(
                        dict(
                            impl=impl,
                            condition=cond,
                            threads=nt,
                            blocks=n,
                            bytes=nbytes,
                            reps=len(ts),
                            ms_p50=ms,
                            ms_min=1e3 * ts[0],
                            gbps=gbps,
                            gbps_per_thread=gbps / nt,
                            correct=bool(ok),
                        )
                    )
                    print(
                        f"{impl:6s} {cond:8s} threads={nt} blocks={n:6d}: {gbps:6.2f} GB/s "
                        f"({gbps / nt:5.2f}/thread, p50 {ms:7.2f} ms, {len(ts)} reps)",
                        flush=True,
                    )
            stager.close()
            if pool is not None:
                pool.shutdown()
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--blocks", type=int, nargs="+", default=[256, 768, 4096, 24576])
    p.add_argument("--conditions", nargs="+", default=["idle", "launcher", "python"])
    p.add_argument("--impls", nargs="+", default=["legacy", "flat"])
    p.add_argument("--pool-gb", type=float, default=2.0, help="host pool GiB per tensor (K and V each)")
    p.add_argument("--min-s", type=float, default=0.6, help="seconds of repetitions per configuration")
    p.add_argument("--rotate-mb", type=int, default=1024, help="MiB of source rows the index sets rotate over")
    p.add_argument("--out", default=None, help="write the JSON here")
    a = p.parse_args(argv)
    rows = run(a.threads, a.blocks, a.pool_gb, a.conditions, a.impls, a.min_s, rotate_mb=a.rotate_mb)
    meta = dict(
        date=time.strftime("%Y-%m-%d"),
        commit=provenance.commit(default=None),
        torch=torch.__version__,
        cpu=platform.processor() or platform.machine(),
        cores=torch.get_num_threads(),
        parallel_backend=torch.__config__.parallel_info().splitlines()[-1].strip(),
        item=f"{BS}x{D} bf16 (4 KiB) per (block, head), K and V",
        hkv=HKV,
        pool_gb_per_tensor=a.pool_gb,
        rotate_mib=a.rotate_mb,
        design_ref_gbps_per_thread=5.0,
        gpu=False,
    )
    out = dict(meta=meta, rows=rows)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
