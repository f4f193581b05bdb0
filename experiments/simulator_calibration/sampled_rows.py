"""The selection simulated for sampled rows: bytes a step with ``policy_layers`` sampled layers (the default 2, scaled
up to the model's layers) against every layer simulated, on bench points.

    python experiments/simulator_calibration/sampled_rows.py
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from oasis_sim.bench import BenchPoint, run_point  # noqa: E402
from oasis_sim.config import SimConfig  # noqa: E402

POINTS = [
    BenchPoint("qwen3-8b", "lookahead", 16384, 16, kv_budget_gb=52.0),
    BenchPoint("qwen3-8b", "lookahead", 16384, 16, kv_budget_gb=52.0, hot_slots=128),
    BenchPoint("qwen3-8b", "lookahead", 32768, 22, kv_budget_gb=52.0),
    BenchPoint("smollm2-135m", "lookahead", 7800, 82, top_k=64, kv_budget_gb=3.0),
    BenchPoint("smollm2-135m", "lookahead", 7800, 50, top_k=128, kv_budget_gb=3.0),
]


def main():
    default = SimConfig.policy_layers
    print(f"{'point':<48} {'layers':>6} {'MB a step':>10} {'TPOT ms':>8} {'wall s':>7}   vs all layers")
    for p in POINTS:
        L = __import__("oasis_core.specs", fromlist=["get_model"]).get_model(p.model).n_layers
        rows = {}
        for layers in (default, L):
            t = time.perf_counter()
            r = run_point(p, policy_layers=layers)
            rows[layers] = (r, time.perf_counter() - t)
        full = rows[L][0]
        for layers, (r, wall) in rows.items():
            db = 100 * (r.bytes_per_step - full.bytes_per_step) / full.bytes_per_step
            dt = 100 * (r.tpot_s - full.tpot_s) / full.tpot_s
            print(
                f"{p.name:<48} {layers:>6} {r.bytes_per_step / 1e6:>10.2f} {r.tpot_s * 1e3:>8.3f} {wall:>7.2f}   "
                f"bytes {db:+.2f}%  TPOT {dt:+.3f}%"
            )


if __name__ == "__main__":
    main()
