"""Issue 39, item 3: what one layer's fetch-cap evaluation costs on the device, in isolation.

The executor evaluates an adaptive policy once per layer per decode step (``oasis_exec.workingset.fetch_caps.
DeviceCaps.cap``: ``count_missing`` of the rows against the prediction, the policy's arithmetic, its row state
gathered and written back). The two H200 figures in ``README.md`` (``budget:0.5,max_ratio=0.05`` against the fixed cap:
+1.30 ms a step at 16K x 32 requests, 256 rows a layer, and +2.28 ms at 32K x 16, 128 rows) cannot both follow a
per-row cost (which gives 32K half of 16K's) or a fixed per-layer cost (equal), and each is net of the bytes the
policy did not copy. This times the call alone: per rows R (64 .. 512), resident slots S (K, 3K) and policy, the mean
of ``--iters`` calls after a warm-up, with CUDA events on CUDA (host clock elsewhere).

    python experiments/fetch_policies/policy_eval_micro.py --device cuda --out $OUT/policy_eval_micro.json

Writes one JSON object: the device, the date, and rows ``{policy, rows, slots, top_k, us_per_call,
us_count_missing}``. On the CPU it runs too (small ``--iters``), as a check of the script, not a figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

import torch

from oasis_core.fetchcap import get_policy
from oasis_core.selection import count_missing
from oasis_exec.workingset.fetch_caps import DeviceCaps

POLICIES = ("budget:0.5", "budget:0.5,max_ratio=0.05", "per-layer:0.05", "drift", "recall:0.9")


def make_sets(rows: int, slots: int, top_k: int, n_blocks: int, device, gen) -> tuple:
    """A resident set [R, S] and a prediction [R, K] sharing about 90% of the prediction (synthetic churn)."""
    resident = torch.stack([torch.randperm(n_blocks, generator=gen)[:slots] for _ in range(rows)])
    keep = int(0.9 * top_k)
    fresh = torch.randint(0, n_blocks, (rows, top_k - keep), generator=gen)
    pred = torch.cat([resident[:, :keep], fresh], dim=1)
    return resident.to(device), pred.to(device)


def timed(fn, iters: int, device) -> float:
    """Mean microseconds of ``fn()`` over ``iters`` calls (CUDA events on CUDA)."""
    for _ in range(3):
        fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e6 / iters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--top-k", type=int, default=128)
    ap.add_argument("--rows", default="64,128,256,512", help="rows a layer (lanes x KV heads)")
    ap.add_argument("--blocks", type=int, default=1024, help="blocks a row's context holds (16K tokens / 16)")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    k = args.top_k
    out = {
        "what": "DeviceCaps.cap per layer, isolated (experiments/fetch_policies/policy_eval_micro.py)",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("OASIS_COMMIT", "unknown"),
        "torch": torch.__version__,
        "rows": [],
    }
    for rows in (int(r) for r in args.rows.split(",")):
        for slots in (k, 3 * k):
            resident, pred = make_sets(rows, slots, k, args.blocks, device, gen)
            us_missing = timed(lambda r=resident, p=pred: count_missing(r, p), args.iters, device)
            for spec in POLICIES:
                caps = DeviceCaps(
                    policy=get_policy(spec),
                    top_k=k,
                    n_layers=args.layers,
                    bytes_per_block_head=8192,
                    link_bytes_per_s=42e9,
                    device=device,
                    state_rows=rows,
                )
                caps.step_start()
                caps.step_end()  # one step's time on the clock: the policies that read it take their device branch
                for layer in range(args.layers):
                    caps.layer_ready(layer)
                us = timed(lambda c=caps, r=resident, p=pred: c.cap(args.layers // 2, r, p), args.iters, device)
                row = dict(policy=spec, rows=rows, slots=slots, top_k=k, us_per_call=round(us, 2))
                row["us_count_missing"] = round(us_missing, 2)
                row["max_cap"] = caps.max_cap
                out["rows"].append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
