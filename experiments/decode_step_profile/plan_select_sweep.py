"""How fast does one layer's ``plan_select`` run at the engine's shapes, by launch parameters (chunk, warps)?

    python experiments/decode_step_profile/plan_select_sweep.py [--rows 352,128] [--out FILE.json]   # CUDA

The step profile (16K x 44, 055bdf9) puts ``plan_select_kernel`` at 70-94 us a layer (2.5-3.4 ms a step) on the
prediction stream for R = 352 rows of S = K = 128. This times it alone, in a CUDA graph of 36 launches (one per
layer, each on its own copy of the tables, as the step runs them), for every (chunk, num_warps), and checks that
every variant plans exactly what the first (chunk 8, 1 warp) plans. Inputs: random resident sets, a prediction
sharing ``--overlap`` of its blocks with them (the synthetic smollm2 churn keeps most), random last_sel, the
engine's cap (fetch 0.05 of K: 7).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from oasis_kernels.plan_select import plan_select  # noqa: E402


def inputs(R, S, K, n_blocks, overlap, L, dev, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    res = torch.stack([torch.randperm(n_blocks, generator=g)[:S] for _ in range(R)])
    keep = int(overlap * K)
    fresh = torch.stack([torch.randperm(n_blocks, generator=g) for _ in range(R)])
    pred = torch.empty(R, K, dtype=torch.int64)
    for r in range(R):
        new = fresh[r][~torch.isin(fresh[r], res[r])][: K - keep]
        pred[r] = torch.cat([res[r][torch.randperm(S, generator=g)[:keep]], new])[torch.randperm(K, generator=g)]
    ls = -torch.randint(0, 50, (R, S), generator=g)
    tabs = [(res.clone().to(dev), ls.clone().to(dev)) for _ in range(L)]
    return tabs, pred.to(dev).to(torch.int32), (res.to(dev), ls.to(dev))


def run(R, S, K, cap, L, chunk, warps, tabs, pred, rows, lanes, ht, W, H):
    outs = [
        plan_select(r, l, rows, pred, cap, cap, 0, lanes=lanes, H=H, W=W, host_table=ht, chunk=chunk, num_warps=warps)
        for r, l in tabs
    ]
    return outs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="352,128", help="R values (B * H)")
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=128)
    ap.add_argument("--cap", type=int, default=7)
    ap.add_argument("--blocks", type=int, default=1025, help="blocks of the context (16K / 16 + 1)")
    ap.add_argument("--overlap", type=float, default=0.9)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    H, S, K, L = 8, a.slots, a.top_k, a.layers
    recs = []
    for R in (int(x) for x in a.rows.split(",")):
        B = R // H
        tabs0, pred, _ = inputs(R, S, K, a.blocks, a.overlap, L, dev)
        rows = torch.arange(R, device=dev)
        lanes = torch.arange(B, device=dev)
        ht = torch.arange(B * a.blocks, device=dev, dtype=torch.int64).view(B, a.blocks)
        ref = None
        for chunk in (8, 16, 32, 64):
            for warps in (1, 2, 4, 8):
                tabs = [(r.clone(), l.clone()) for r, l in tabs0]
                try:
                    out = run(R, S, K, a.cap, L, chunk, warps, tabs, pred, rows, lanes, ht, S, H)
                except Exception as e:  # a variant that does not compile (registers) is reported, not fatal
                    recs.append(dict(R=R, chunk=chunk, num_warps=warps, error=f"{type(e).__name__}: {e}"[:200]))
                    print(recs[-1], flush=True)
                    continue
                torch.cuda.synchronize()
                got = (tabs[0][0].clone(), tabs[0][1].clone(), out[0].src.clone(), out[0].dst.clone())
                if ref is None:
                    ref = got
                same = all(torch.equal(x, y) for x, y in zip(got, ref))
                # timed: a graph of L launches on fresh tables each replay (the reset is timed apart)
                tabs = [(r.clone(), l.clone()) for r, l in tabs0]

                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(2):
                        run(R, S, K, a.cap, L, chunk, warps, tabs, pred, rows, lanes, ht, S, H)
                torch.cuda.current_stream().wait_stream(s)
                g, gr = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    run(R, S, K, a.cap, L, chunk, warps, tabs, pred, rows, lanes, ht, S, H)
                with torch.cuda.graph(gr):
                    for (r, l), (r0, l0) in zip(tabs, tabs0):
                        r.copy_(r0)
                        l.copy_(l0)

                def timed(graph_list):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    e0.record()
                    for _ in range(a.reps):
                        for gg in graph_list:
                            gg.replay()
                    e1.record()
                    torch.cuda.synchronize()
                    return e0.elapsed_time(e1) / a.reps

                timed([gr, g])
                both, only_reset = timed([gr, g]), timed([gr])
                us = 1e3 * (both - only_reset) / L
                recs.append(
                    dict(
                        R=R,
                        S=S,
                        K=K,
                        cap=a.cap,
                        chunk=chunk,
                        num_warps=warps,
                        us_per_layer=round(us, 2),
                        same_as_first=same,
                    )
                )
                print(recs[-1], flush=True)
    doc = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        commit=os.environ.get("OASIS_COMMIT"),
        records=recs,
    )
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
