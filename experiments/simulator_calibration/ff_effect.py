"""The fast-forward's effect on every metric and the simulator's speed, per trace and mode.

    python experiments/simulator_calibration/ff_effect.py TRACE.json... [--hardware h100-sxm] [--out FILE.json]

Runs each trace in ``lookahead`` and ``dense`` with ``fast_forward=0`` (every step simulated) and the default, in
one process, and prints simulated seconds per wall second and the relative difference of every numeric summary
metric (``summary.json``) between the two. Wall time here is ``SimResult.wall_s`` (the simulation, not the
process), and the CPU seconds of this process during it (``time.process_time``: on a shared, loaded VM the wall
time also counts the other jobs' turns); ``farm-bench`` measures the whole process (README).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from oasis_sim.config import SimConfig, make_config  # noqa: E402
from oasis_sim.sim import simulate  # noqa: E402
from oasis_sim.workloads import load_workload  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--hardware", default=SimConfig.hardware)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = []
    for path in a.traces:
        trace = load_workload(path)
        for mode in ("lookahead", "dense"):
            res, cpu = {}, {}
            for ff in (0, SimConfig.fast_forward):
                c0 = time.process_time()
                r = simulate(make_config({"mode": mode, "hardware": a.hardware, "fast_forward": ff}), trace)
                cpu[ff] = time.process_time() - c0
                res[ff] = r
            base, fast = res[0].summary, res[SimConfig.fast_forward].summary
            diffs = {}
            for k, v in base.items():
                w = fast.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(w, (int, float)) and v:
                    diffs[k] = 100.0 * (w - v) / abs(v)
            worst = max(diffs.items(), key=lambda kv: abs(kv[1]))
            row = {
                "trace": os.path.basename(path),
                "mode": mode,
                "hardware": a.hardware,
                "simulated_s": base["simulated_s"],
                "wall_s_ff0": round(res[0].wall_s, 2),
                "wall_s_ff": round(res[SimConfig.fast_forward].wall_s, 2),
                "speed_ff0": round(base["simulated_s"] / res[0].wall_s, 1),
                "speed_ff": round(fast["simulated_s"] / res[SimConfig.fast_forward].wall_s, 1),
                "cpu_s_ff0": round(cpu[0], 2),
                "cpu_s_ff": round(cpu[SimConfig.fast_forward], 2),
                "speed_cpu_ff": round(fast["simulated_s"] / cpu[SimConfig.fast_forward], 1),
                "worst_metric": worst[0],
                "worst_diff_pct": round(worst[1], 4),
                "diff_pct": {k: round(v, 4) for k, v in diffs.items() if v},
            }
            out.append(row)
            print(
                f"{row['trace']:<24} {mode:<10} sim {row['simulated_s']:>8.1f} s  wall {row['wall_s_ff0']:>6.2f} -> "
                f"{row['wall_s_ff']:>6.2f} s  speed {row['speed_ff0']:>7.1f}x -> {row['speed_ff']:>7.1f}x  CPU "
                f"{row['cpu_s_ff']:.2f} s ({row['speed_cpu_ff']:.0f}x)  worst metric "
                f"change {row['worst_metric']} {row['worst_diff_pct']:+.4f}%",
                flush=True,
            )
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
