"""The simulator's speed on the production traces: simulated seconds per CPU second and per wall second of ``simulate()``.

    python experiments/simulator_calibration/speed.py TRACE.json... [--modes dense,lookahead] [--src DIR] [--label L]
        [--no-gc-collect]

Runs ``simulate()`` once per trace and mode in this process with ``run``'s defaults (the current ``SimConfig``:
one H100 SXM, the calibrated predictor, the default ``fast_forward``) and prints one line each: the simulated
seconds, the CPU seconds of the simulation (``time.process_time``: on a shared, loaded VM the wall time also counts
other jobs' turns) and its wall seconds (``time.perf_counter``), each with its simulated-seconds-per-second. ``--src
DIR`` imports the simulator from another checkout (``git archive COMMIT | tar -x -C DIR``) so that two commits can be
timed alternately by the same script on the same machine. Each run starts from a collected heap (the previous
run's result dropped, then ``gc.collect()``, neither timed): otherwise a full collection that lands in a run also
frees the previous runs' cyclic garbage (their engine, scheduler and requests: ~0.03-0.05 s on these traces), and
where it lands moves with any allocation anywhere. ``--no-gc-collect``: as before 2026-12-06 20:00 UTC (no collection
between runs; the previous result is freed inside the next run's time). ``gc2``: the full collections inside the
run. Traces: ``python -m oasis_sim import azure|mooncake SRC -o TRACE.json`` from ``../shared/traces/``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--modes", default="dense,lookahead")
    ap.add_argument("--src", default=os.path.dirname(os.path.dirname(HERE)), help="checkout to import oasis_sim from")
    ap.add_argument("--label", default="")
    ap.add_argument("--no-gc-collect", action="store_true", help="no gc.collect() before each run")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.src))
    from oasis_sim.config import make_config
    from oasis_sim.sim import simulate
    from oasis_sim.workloads import load_workload

    for path in a.traces:
        trace = load_workload(path)
        for mode in a.modes.split(","):
            cfg = make_config({"mode": mode})
            if not a.no_gc_collect:  # (the previous run's result freed too: not in this run's time)
                res = None
                gc.collect()
            full0 = gc.get_stats()[2]["collections"]
            c0, w0 = time.process_time(), time.perf_counter()
            res = simulate(cfg, trace)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            full = gc.get_stats()[2]["collections"] - full0
            sim_s = res.summary["simulated_s"]
            name = os.path.splitext(os.path.basename(path))[0]
            print(
                f"{a.label:<5}{name}:{mode:<10} sim {sim_s:9.1f} s  cpu {cpu:6.2f} s ({sim_s / cpu:7.0f}x)  "
                f"wall {wall:6.2f} s ({sim_s / wall:7.0f}x)  steps {res.summary['steps']}  gc2 {full}",
                flush=True,
            )


if __name__ == "__main__":
    main()
