"""The victim cache's two kernels alone, at the engine's rows of one layer (GPU only): plan_select over S slots
(Algorithm 2; for S > K by compares and through rows of marks, ExecConfig.plan_marks) and attend_slots
(the K slots attention reads, one launch on the main stream per layer). Prints and writes JSON lines.

    python experiments/dense_vs_lookahead_throughput/victim_kernels.py --out victim_kernels.jsonl
"""

from __future__ import annotations

import argparse
import json

import torch

import oasis_kernels  # noqa: F401
from oasis_kernels.attend_slots import attend_slots, attend_slots_ref
from oasis_kernels.plan_select import plan_select


def tables(R, S, K, n_blocks, g):
    """A layer's tables after some steps: every slot full (distinct blocks), last_sel spread over 40 steps, and a
    prediction that keeps all but ``drift`` of the most recent K."""
    res = torch.stack([torch.randperm(n_blocks, generator=g)[:S] for _ in range(R)])
    ls = -torch.randint(0, 40, (R, S), generator=g)
    pred = res[:, :K].clone()
    drift = 30  # the smollm2 preset's ~0.23 x 128 blocks a step
    new = torch.stack([torch.randperm(n_blocks, generator=g)[:drift] for _ in range(R)])
    pred[:, K - drift :] = new  # some of these are resident (hits), the rest missing
    return res, ls, pred


def measure(R, S, K, C, n_blocks, g, dev, do_bench) -> list[dict]:
    """plan_select's us a launch (less the table restore it needs each repeat), by compares and, for S > K, through
    rows of marks (``ExecConfig.plan_marks``); for S > K also attend_slots'."""
    res0, ls0, pred = (t.to(dev) for t in tables(R, S, K, n_blocks, g))
    rows = torch.arange(R, device=dev)
    res, ls = res0.clone(), ls0.clone()

    def restore():
        res.copy_(res0)
        ls.copy_(ls0)

    recs = []
    restore_ms = do_bench(restore, warmup=25, rep=200)
    for marks in (None, torch.zeros(R, n_blocks, dtype=torch.int32, device=dev)) if S > K else (None,):

        def plan(marks=marks):
            restore()
            plan_select(res, ls, rows, pred, C, C, 0, marks=marks)

        plan_ms = do_bench(plan, warmup=25, rep=200) - restore_ms
        rec = dict(kernel="plan_select", rows=R, S=S, K=K, C=C, marks=marks is not None, us=round(plan_ms * 1e3, 2))
        recs.append(rec)
    if S > K:
        out = torch.empty(R, K, dtype=torch.int32, device=dev)
        a_ms = do_bench(lambda: attend_slots(res, ls, rows, K, S + 2, out=out), warmup=25, rep=200)
        equal = bool(torch.equal(out, attend_slots_ref(res, ls, rows, K, S + 2)))
        recs.append(dict(kernel="attend_slots", rows=R, S=S, K=K, us=round(a_ms * 1e3, 2), equal=equal))
    return recs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="352,128,176", help="rows of a layer: 44, 16, 22 lanes x 8 KV heads")
    ap.add_argument("--slots", default="128,256,384")
    args = ap.parse_args(argv)
    from triton.testing import do_bench

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    with open(args.out, "a") as f:
        for R in map(int, args.rows.split(",")):
            for S in map(int, args.slots.split(",")):
                for rec in measure(R, S, 128, 6, 1024, g, dev, do_bench):
                    print(json.dumps(rec))
                    f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
