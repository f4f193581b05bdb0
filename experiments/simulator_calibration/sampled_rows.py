"""The selection simulated for sampled rows: bytes a step of bench points by how many (request, layer) groups the
simulator samples, against the bench view's default (every full layer of ``ceil(64 / layers)`` requests).

    python experiments/simulator_calibration/sampled_rows.py [--seeds N]

Rows per point (each with the bench view's profile over every pass of the run, ``oasis_sim.bench.run_point``):
``2 x 1`` = ``policy_layers`` 2 of one request (the trace default's rows), over ``--seeds`` seeds (mean, spread);
``2 x 32`` = 2 layers of 32 requests (seed 0); ``L x R`` = the bench default (``--default-seeds`` seeds; the
figures are relative to its mean).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from oasis_core.specs import get_model  # noqa: E402
from oasis_sim.bench import SELECTION_GROUPS, BenchPoint, run_point  # noqa: E402

POINTS = [
    BenchPoint("qwen3-8b", "lookahead", 16384, 16, kv_budget_gb=52.0),
    BenchPoint("qwen3-8b", "lookahead", 16384, 16, kv_budget_gb=52.0, fetch_ratio=0.02),
    BenchPoint("qwen3-8b", "lookahead", 16384, 16, kv_budget_gb=52.0, hot_slots=128),
    BenchPoint("qwen3-8b", "lookahead", 32768, 22, kv_budget_gb=52.0),
    BenchPoint("smollm2-135m", "lookahead", 7800, 82, top_k=64, kv_budget_gb=3.0),
    BenchPoint("smollm2-135m", "lookahead", 7800, 50, top_k=128, kv_budget_gb=3.0),
]


def runs(p, seeds, **over):
    out = []
    for seed in seeds:
        t = time.perf_counter()
        r = run_point(p, seed=seed, **over)
        out.append((r.bytes_per_step, r.tpot_s, time.perf_counter() - t))
    return np.array(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--default-seeds", type=int, default=3, help="seeds of the bench default's row")
    a = ap.parse_args()
    seeds = range(a.seeds)
    print(f"{'point':<50} {'layers x requests':<20} {'seeds':>5} {'MB a step':>10} {'vs default':>10} "
          f"{'seed spread':>16} {'TPOT ms':>8} {'wall s':>7}")  # fmt: skip
    for p in POINTS:
        L = get_model(p.model).n_full_layers
        R = -(-SELECTION_GROUPS // L)
        ref = runs(p, range(a.default_seeds))
        base = ref[:, 0].mean()
        rows = [
            ("2 x 1", runs(p, seeds, policy_layers=2, profile_replicas=1)),
            ("2 x 32", runs(p, [0], policy_layers=2, profile_replicas=32)),
            (f"{L} x {R} (default)", ref),
        ]
        name = f"{p.name}:f{p.fetch_ratio}"
        for label, x in rows:
            b = x[:, 0]
            d = 100 * (b / base - 1)
            spread = f"{d.min():+.1f} .. {d.max():+.1f}%" if len(b) > 1 else ""
            print(
                f"{name:<50} {label:<20} {len(b):>5} {b.mean() / 1e6:>10.2f} {100 * (b.mean() / base - 1):>+9.1f}% "
                f"{spread:>16} {1e3 * x[:, 1].mean():>8.3f} {x[:, 2].mean():>7.2f}"
            )


if __name__ == "__main__":
    main()
