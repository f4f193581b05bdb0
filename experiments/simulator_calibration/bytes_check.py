"""Bytes a step: the simulator's synthetic selection against the executor's measured copies, per bench point.

    python experiments/simulator_calibration/bytes_check.py [POINTS...]   # default: traces/bench_points/train

The calibration is fitted on the points' *measured* bytes (``oasis_sim.calibrate``), never on the simulator's own,
so the bytes a step the simulator predicts are not fitted to these points: every point with a measured figure
(background modes with copies) is scored here, the fitted ones included. Prints a table and the median and worst
error by group.
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from oasis_core import modes  # noqa: E402
from oasis_sim.bench import load_points, run_point  # noqa: E402


def main(paths):
    pts, _ = load_points(paths or [os.path.join(ROOT, "traces", "bench_points", "train")])
    seen, groups = set(), {}
    print(f"{'point':<62} {'measured MB':>12} {'simulated MB':>13} {'err %':>7}")
    for p in pts:
        if not modes.get(p.mode).background or p.no_transfer or not p.bytes_per_step:
            continue
        key = (
            p.model,
            p.mode,
            p.context,
            p.lanes,
            p.top_k,
            p.hot_slots,
            p.fetch_ratio,
            p.host_kv_dtype,
            p.selection,
            round(p.bytes_per_step),
        )
        if key in seen:
            continue
        seen.add(key)
        r = run_point(p, predictor="calibrated")
        e = 100.0 * (r.bytes_per_step - p.bytes_per_step) / p.bytes_per_step
        g = f"{p.model} S={'3K' if p.hot_slots and p.hot_slots > p.top_k else 'K'} {p.selection}"
        groups.setdefault(g, []).append(e)
        print(f"{p.name[:61]:<62} {p.bytes_per_step / 1e6:>12.2f} {r.bytes_per_step / 1e6:>13.2f} {e:>+7.1f}")
    print()
    allv = [e for v in groups.values() for e in v]
    for g, v in sorted(groups.items()) + [("all", allv)]:
        a = np.abs(v)
        print(f"{g:<40} n={len(v):>2}  median |err| {np.median(a):5.1f}%  worst {max(v, key=abs):+6.1f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
