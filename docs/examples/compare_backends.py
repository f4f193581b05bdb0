"""Executor and simulator side by side: each bench record (a line of ``bench --out FILE``) next to the simulator's
replay of the same run's recording (``bench --record FILE``: its workload and configuration), with the record's
fetch policy, exact policy sampling. CPU only.

Usage: python docs/examples/compare_backends.py BENCH.jsonl RECORDING...   (recording i is the run of line i)
"""

import json
import sys

from oasis_core.recording import load_recording
from oasis_sim.replay import replay

ROWS = [  # (metric, bench record field, simulator replay field)
    ("throughput tok/s", "throughput_tok_s", "throughput_tok_s"),
    ("TPOT p50 ms", "tpot_ms_p50", "tpot_ms_p50"),
    ("TPOT p99 ms", "tpot_ms_p99", "tpot_ms_p99"),
    ("host->GPU bytes/step", "bytes_moved_per_step", "pcie_h2d_bytes_per_step"),
    ("stall ms/step", "stall_ms_per_step", "stall_ms_per_step"),  # the bench measures it with --profile only
]


def fmt(v):
    return "-" if v is None else f"{v:,.4g}"


def main(bench_jsonl, *recordings):
    with open(bench_jsonl) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if len(records) != len(recordings):
        raise SystemExit(f"{bench_jsonl}: {len(records)} records, but {len(recordings)} recordings given")
    for b, path in zip(records, recordings):
        rec = load_recording(path)
        for k in ("mode", "context", "concurrency", "top_k", "fetch_ratio"):
            if rec.config[k] != b[k]:
                raise SystemExit(f"{path}: {k} {rec.config[k]!r} is not the record's {b[k]!r}: not the same run")
        policy = b["fetch_policy"] or f"fixed:{b['fetch_ratio']:g}"
        sim = replay(rec, config={"fetch_policy": policy, "policy_sampling": "exact"})
        b["stall_ms_per_step"] = (b["stage_ms_per_step"] or {}).get("stall")
        print(f"{policy}: {b['concurrency']} x {b['context']} tokens, {b['mode']}, bench on {b['device']}")
        print(f"  {'metric':<22} {'bench':>12} {'simulator':>12}")
        for name, kb, ks in ROWS:
            print(f"  {name:<22} {fmt(b.get(kb)):>12} {fmt(sim.predicted[ks]):>12}")
        print(f"  {'resident recall':<22} {'-':>12} {fmt(sim.sim.summary['resident_recall']):>12}")
        print(f"  {'drift blocks/step':<22} {fmt(b['drift_blocks_per_step']):>12} {'-':>12}")


if __name__ == "__main__":
    main(*sys.argv[1:])
