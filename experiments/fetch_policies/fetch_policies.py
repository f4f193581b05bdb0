"""Fetch-cap policies in the simulator: ``Fixed(0.05)`` (the paper default) against ``LinkBudget`` (paper eq. 3:
each step may move ``B_link · T_decode · fraction`` bytes, split over the rows that miss blocks).

    python experiments/fetch_policies/fetch_policies.py [--concurrency 32,128] [--policies fixed:0.05,budget:0.5,...]
                                      [--output-tokens 256] [--out-dir DIR]

Workload: closed loop, equal requests of 16,384 prompt tokens and ``--output-tokens`` output tokens,
``concurrency + concurrency // 4`` requests (one wave and a quarter: the last quarter is admitted while the first
requests decode), Qwen3-8B on the H100 SXM preset, ``mode=lookahead``, host DRAM of the whole node (as
``paper_repro.py``). Every policy runs with ``policy_sampling=exact`` (an adaptive policy needs the live step time;
Fixed runs the same way so the rows differ only by the policy). Writes
``results/sim_fetch_policies.{md,json}`` (beside this script) with the machine, date and commit inside.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common import reporting as common  # noqa: E402

common.ensure_repo_on_path()

from oasis_sim.config import SimConfig  # noqa: E402
from oasis_sim.sim import simulate  # noqa: E402
from oasis_sim.workloads import uniform_trace  # noqa: E402

NODE_HOST_BYTES = 0.9 * 2048e9  # whole DGX H100 host DRAM, 90% usable for KV (as paper_repro.py)
CONTEXT = 16384


def run_one(conc: int, policy: str, out_tokens: int) -> dict:
    n = conc + conc // 4
    cfg = SimConfig(
        hardware="h100-sxm",
        model="qwen3-8b",
        mode="lookahead",
        concurrency=conc,
        timeline_steps=0,
        host_bytes=NODE_HOST_BYTES,
        policy_sampling="exact",
        fetch_policy=policy,
    )
    t0 = time.perf_counter()
    res = simulate(cfg, uniform_trace(n, CONTEXT, out_tokens))
    s = res.summary
    st = common.step_stats(res.steps)
    return {
        "concurrency": conc,
        "policy": s["fetch_policy"],
        "requests": n,
        "output_tokens": out_tokens,
        "throughput_tok_s": s["throughput_tok_s"],
        "tpot_ms_p50": s["tpot_ms_p50"],
        "tpot_ms_p99": s["tpot_ms_p99"],
        "decode_tok_s": round(st["decode_tok_s"], 2),
        "decode_step_ms": round(st["decode_step_ms"], 3),
        "h2d_bytes_per_step": s["h2d_bytes_per_step"],
        "h2d_bytes_per_decode_step_p50": round(st["h2d_bytes_per_decode_step_p50"], 0),
        "h2d_gb_s_decode": round(st["h2d_gb_s_decode"], 3),
        "h2d_bytes": s["h2d_bytes"],
        "stall_ms_total": s["stall_ms_total"],
        "stall_ms_per_step": round(s["stall_ms_total"] / s["steps"], 4),
        "resident_recall": s["resident_recall"],
        "steps": s["steps"],
        "preemptions": s["preemptions"],
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def markdown(prov: dict, args, rows: list, wall: float) -> str:
    cols = [
        ("concurrency", "conc", "{}"),
        ("policy", "policy", "`{}`"),
        ("throughput_tok_s", "tok/s e2e", "{:,.1f}"),
        ("decode_tok_s", "tok/s decode", "{:,.1f}"),
        ("tpot_ms_p50", "TPOT p50 ms", "{:.2f}"),
        ("decode_step_ms", "decode step ms", "{:.2f}"),
        ("h2d_bytes_per_step", "h2d MB/step", None),
        ("h2d_gb_s_decode", "h2d GB/s decode", "{:.2f}"),
        ("stall_ms_total", "stall ms total", "{:,.1f}"),
        ("stall_ms_per_step", "stall ms/step", "{:.3f}"),
        ("resident_recall", "resident recall", "{:.4f}"),
    ]
    out = [
        f"# Fetch-cap policies in the simulator: Fixed vs LinkBudget (eq. 3), {prov['date_utc'][:10]}",
        "",
        f"Commit `{prov['commit']}` (sim tree dirty: {prov['sim_tree_dirty']}); oasis_sim + oasis_core sources "
        f"sha256 `{prov['sim_source_sha256']}`; {prov['date_utc']}; machine: {prov['machine']}.",
        "",
        f"Produced by `python experiments/fetch_policies/fetch_policies.py --concurrency {args.concurrency} --policies "
        f"{args.policies} --output-tokens {args.output_tokens}` ({wall:.1f} s wall); raw rows in "
        f"`sim_fetch_policies.json`.",
        "",
        f"Workload: closed loop, {CONTEXT:,}-token prompts, {args.output_tokens} output tokens, concurrency + "
        "concurrency/4 requests, Qwen3-8B, H100 SXM preset (effective scattered h2d 30.4 GB/s), "
        "`mode=lookahead`, `policy_sampling=exact` for every policy, node host DRAM.",
        "",
        "| " + " | ".join(c[1] for c in cols) + " |",
        "| " + " | ".join("---" for _ in cols) + " |",
    ]
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = r[key]
            cells.append(f"{v / 1e6:,.1f}" if fmt is None else fmt.format(v))
        out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "Columns: `tok/s e2e` = output tokens / simulated time (prefill included); `tok/s decode` and "
        "`decode step ms` over the steps with no prefill work; `h2d MB/step` = host->GPU bytes per engine step "
        "(all steps, first fills included); `h2d GB/s decode` = bytes / time of the decode-only steps; "
        "`stall` = compute-stream time waiting for a layer's transfer (layer-local sync); `resident recall` = "
        "share of the true top-K resident when a layer attends.",
        "",
    ]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="32,128")
    p.add_argument("--policies", default="fixed:0.05,budget:0.5,budget:0.8,budget:1")
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)
    prov = common.provenance()
    rows = []
    t0 = time.perf_counter()
    for conc in (int(c) for c in args.concurrency.split(",")):
        for pol in args.policies.split(","):
            r = run_one(conc, pol, args.output_tokens)
            rows.append(r)
            print(
                f"c={conc:3d} {r['policy']:<14} {r['throughput_tok_s']:8.1f} tok/s  TPOT p50 {r['tpot_ms_p50']:7.2f} ms"
                f"  h2d {r['h2d_bytes_per_step'] / 1e6:8.1f} MB/step  stall {r['stall_ms_total']:9.1f} ms  "
                f"recall {r['resident_recall']:.4f}  ({r['wall_s']} s)",
                flush=True,
            )
    wall = time.perf_counter() - t0
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "sim_fetch_policies"
    (out / f"{stem}.json").write_text(
        json.dumps({"provenance": prov, "args": vars(args), "wall_s": round(wall, 2), "rows": rows}, indent=2) + "\n"
    )
    (out / f"{stem}.md").write_text(markdown(prov, args, rows, wall))
    print(f"wrote {out / stem}.md and .json ({wall:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
