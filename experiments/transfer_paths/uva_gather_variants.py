"""The UVA gather's launch variants, alone and beside an HBM-bound GEMM load, on the GPU (issue 5 item 1).

    python experiments/transfer_paths/uva_gather_variants.py --out FILE.json [--items 3584] [--programs 8,16,32] [--ipi 2,4,8]
        [--warps 4,8] [--kernel uva,tma] [--stages 2,4] [--tma-warps 1,4] [--dry-run]

In the decode step the gather (``oasis_kernels.gather.uva_gather``) moved 42.8 GB/s at 64 requests, hiding 70% of its copy
time. This sweep asks whether a launch variant (programs, items per iteration = bytes in flight per program, warps)
moves more or hides more. The load beside it stands in for a decode step: ``--gemms`` bf16 GEMMs of [M=64, 4096] by
[4096, 16384] (each reads its 134 MB weight once: HBM-bound, like the step's weight reads), run on the main stream
while the gather runs on a side stream. Per variant: gather alone (ms, GB/s), load alone, both together, and
hidden = (alone_gather + alone_load - together) / min(alone_gather, alone_load). Each variant's copy is checked
against the host pool. One JSON file with every row and the device/date/commit.

``--kernel tma`` adds the experimental ``oasis_kernels.gather_tma.tma_gather`` (TMA tile loads; variants: programs x
``--stages`` tiles in flight x ``--tma-warps``): does a gather that barely occupies its SMs keep more of its rate
beside the load? Its rows carry ``kernel: "tma"`` and ``stages`` in place of ``items_per_iter``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def ints(s):
    return [int(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--items", type=int, default=3584, help="(block, head) items: 3,584 = one layer at 64 requests")
    ap.add_argument("--programs", type=ints, default=[8, 16, 32])
    ap.add_argument("--ipi", type=ints, default=[2, 4, 8], help="items per iteration of a program")
    ap.add_argument("--warps", type=ints, default=[4, 8])
    ap.add_argument("--gemms", type=int, default=24, help="GEMMs of the load beside the gather")
    ap.add_argument("--kernel", default="uva", help="uva, tma or uva,tma")
    ap.add_argument("--stages", type=ints, default=[2, 4], help="tma: tiles in flight per program")
    ap.add_argument("--tma-warps", type=ints, default=[1, 4])
    ap.add_argument("--pool-gb", type=float, default=8.0)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    kinds = a.kernel.split(",")
    variants = [("uva", p, i, w) for p in a.programs for i in a.ipi for w in a.warps] * ("uva" in kinds) + [
        ("tma", p, st, w) for p in a.programs for st in a.stages for w in a.tma_warps
    ] * ("tma" in kinds)
    print(f"{len(variants)} variants, {a.items} items ({a.items * 8192 / 1e6:.1f} MB a copy), load {a.gemms} GEMMs")
    if a.dry_run:
        return 0
    import torch
    from triton.testing import do_bench

    import oasis_kernels  # noqa: F401
    from oasis_kernels.gather import _bench_setup, uva_gather
    from oasis_kernels.gather_tma import tma_gather

    hk, hv, ks, vs, sb, sh, ds = _bench_setup(a.items, a.pool_gb, 8, 16, 128, 0)
    dev = ks.device
    sb_g, sh_g, ds_g = sb.to(dev), sh.to(dev), ds.to(dev)
    nbytes = a.items * 16 * 128 * 2 * 2
    x = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
    ws = [torch.randn(4096, 16384, device=dev, dtype=torch.bfloat16) for _ in range(4)]
    side = torch.cuda.Stream()

    def load():
        for j in range(a.gemms):
            x @ ws[j % 4]

    load_ms = do_bench(load, warmup=5, rep=50)
    rows = []
    i_chk = a.items // 2
    for kern, p, ipi, w in variants:

        def gather(kern=kern, p=p, ipi=ipi, w=w):
            if kern == "tma":
                tma_gather(hk, hv, sb_g, sh_g, ds_g, ks, vs, n_programs=p, stages=ipi, num_warps=w)
            else:
                uva_gather(hk, hv, sb_g, sh_g, ds_g, ks, vs, n_programs=p, items_per_iter=ipi, num_warps=w)

        name = dict(kernel=kern, programs=p, warps=w, **({"stages": ipi} if kern == "tma" else {"items_per_iter": ipi}))
        try:
            ks.zero_()
            gather()
            torch.cuda.synchronize()
            ok = bool(torch.equal(ks[int(ds[i_chk])].cpu(), hk[int(sb[i_chk]), int(sh[i_chk])]))
            g_ms = do_bench(gather, warmup=5, rep=50)

            def both(gather=gather):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    gather()
                load()
                torch.cuda.current_stream().wait_stream(side)

            t_ms = do_bench(both, warmup=5, rep=50)
            hidden = (g_ms + load_ms - t_ms) / min(g_ms, load_ms)
            row = dict(
                name,
                correct=ok,
                gather_ms=g_ms,
                gather_gb_s=nbytes / g_ms / 1e6,
                load_ms=load_ms,
                together_ms=t_ms,
                hidden=hidden,
                gather_gb_s_beside=nbytes / max(t_ms - load_ms, 1e-9) / 1e6 if t_ms > load_ms else None,
            )
        except Exception as e:  # a variant that does not compile or launch (e.g. too many registers)
            row = dict(name, error=f"{type(e).__name__}: {e}"[:300])
        rows.append(row)
        print(json.dumps(row), flush=True)
    rec = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=os.environ.get("OASIS_COMMIT", "unknown"),
        items=a.items,
        bytes=nbytes,
        gemms=a.gemms,
        load_ms=load_ms,
        rows=rows,
    )
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
