"""Benchmark every kernel on the GPU: GB/s against the roofline (4.3 TB/s HBM, 55.3 GB/s host->GPU).

    python -m oasis_kernels.bench [--quick] [--only paged_attn,sparse_attn,...] [--out results.json]

Prints one line per configuration and, with ``--out``, writes a JSON document: device, date, commit and a list of
records (kernel, shape, launch parameters, ms, bytes, GB/s, fraction of the roofline, error vs the reference).
Without ``--quick`` the attention kernels sweep their launch parameters, and the best configuration of each is
reported at the end: pass those as the wrappers' defaults or arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch

from oasis_core import provenance

from .block_score import bench_block_score
from .block_scorers import bench_block_score_any
from .fused_ops import bench_fused_ops
from .gather import bench_gather
from .paged_attn import bench_paged_attn
from .ring_attn import bench_ring_attn
from .sparse_attn import bench_sparse_attn
from .summary_update import bench_summary_update
from .topk_select import bench_topk_select

TILES = (2, 4, 8)  # pages / blocks an iteration
SPLIT_SWEEP = [1, 2, 3, 4, 6, 8, 12]
ATTN = {  # kernel: (bench function, name of its tile argument, shape of the headline case, its tiles)
    "paged_attn": (bench_paged_attn, "pages_per_iter", dict(batch=32, context=16384), TILES),
    "sparse_attn": (bench_sparse_attn, "blocks_per_iter", dict(batch=64, top_k=128), TILES),
    # Gemma 3 270M's 15 sliding layers at 128 lanes (ms: the 15 layers; ms_torch: the torch path's)
    "ring_attn": (bench_ring_attn, "block_n", dict(batch=128), (16, 32, 64)),
}


def _attn_sweep(name, quick, run):
    """Stage 1: tile / warps / stages at the default split; stage 2: split counts at the best of stage 1."""
    fn, tile_arg, shape, tiles = ATTN[name]
    if quick:
        run(name, fn, dict(shape))
        return
    best = None
    for cfg in [dict(tile=t, num_warps=w, num_stages=st) for t in tiles for w in (4, 8) for st in (2, 3, 4)]:
        kw = dict(shape, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **{tile_arg: cfg["tile"]})
        r = run(name, fn, kw)
        if r is not None and (best is None or r["gbps"] > best[1]):
            best = (kw, r["gbps"])
    if best is not None:
        for n_split in SPLIT_SWEEP:
            run(name, fn, dict(best[0], n_split=n_split))


def _other_runs(quick):
    runs = [
        ("paged_attn", bench_paged_attn, dict(batch=8, context=16384)),
        ("paged_attn", bench_paged_attn, dict(batch=8, context=32768)),
        ("paged_attn", bench_paged_attn, dict(batch=40, context=16384)),
        ("sparse_attn", bench_sparse_attn, dict(batch=8, top_k=128)),
        ("sparse_attn", bench_sparse_attn, dict(batch=128, top_k=128)),
        ("ring_attn", bench_ring_attn, dict(batch=57)),
        ("ring_attn", bench_ring_attn, dict(batch=28)),
        ("ring_attn", bench_ring_attn, dict(batch=128, nq=2)),
        ("block_score", bench_block_score, dict(batch=64, context=16384)),
        ("block_score", bench_block_score, dict(batch=8, context=16384)),
        ("block_score_any", bench_block_score_any, dict(scorer="minmax_sum+sink", batch=64, context=16384)),
        ("block_score_any", bench_block_score_any, dict(scorer="gauss", batch=64, context=16384)),
        ("block_score_any", bench_block_score_any, dict(scorer="mean", batch=64, context=16384)),
        ("summary_update", bench_summary_update, dict(batch=64)),
        ("fused_ops", bench_fused_ops, dict(batch=8)),
        ("fused_ops", bench_fused_ops, dict(batch=64)),
    ]
    for batch, context in ((44, 16384), (16, 16384), (22, 32768)):  # the engine's rows of one layer
        for warps in (4,) if quick else (4, 8):
            runs.append(("topk_select", bench_topk_select, dict(batch=batch, context=context, num_warps=warps)))
    for n in (256, 4096, 24576):
        for p, t in ((16, 8), (32, 16)) if not quick else ((16, 8),):
            runs.append(("gather", bench_gather, dict(n_items=n, n_programs=p, n_threads=t)))
    return runs


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m oasis_kernels.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="default launch parameters only, no sweep")
    ap.add_argument("--only", default="", help="comma-separated kernel names to run")
    ap.add_argument("--out", default=None, help="write the JSON records here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("oasis_kernels.bench needs CUDA", file=sys.stderr)
        return 2
    only = set(filter(None, args.only.split(",")))
    records = []

    def run(name, fn, kw):
        if only and name not in only:
            return None
        try:
            res = fn(**kw)
        except Exception as e:  # a launch configuration that does not compile or fit must not end the sweep
            res = dict(kernel=name, error=f"{type(e).__name__}: {e}"[:300], **kw)
        for r in res if isinstance(res, list) else [res]:
            records.append(r)
            if "error" in r:
                print(f"{name:15s} {kw} ERROR {r['error']}", flush=True)
            else:
                shown = {
                    k: v
                    for k, v in r.items()
                    if k not in ("kernel", "bytes", "roofline_gbps", "ms", "gbps", "frac_roofline")
                }
                print(
                    f"{r['kernel']:15s} {r['ms'] * 1e3:9.1f} us {r['gbps']:8.1f} GB/s "
                    f"{100 * r['frac_roofline']:5.1f}% of roofline  {shown}",
                    flush=True,
                )
        return None if isinstance(res, list) or "error" in res else res

    for name in ATTN:
        _attn_sweep(name, args.quick, run)
    for name, fn, kw in _other_runs(args.quick):
        run(name, fn, kw)
    best = {}
    for r in records:
        if "error" in r or r["kernel"] not in ATTN:
            continue
        key = (r["kernel"], r["batch"])
        if key not in best or r["gbps"] > best[key]["gbps"]:
            best[key] = r
    print("best per (kernel, batch):")
    for (k, b), r in sorted(best.items()):
        print(f"  {k} batch {b}: {r['gbps']:.0f} GB/s ({100 * r['frac_roofline']:.1f}%) {r}")
    doc = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        commit=provenance.commit(full=True, default=None),
        torch=torch.__version__,
        records=records,
        best=[r for _, r in sorted(best.items())],
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
