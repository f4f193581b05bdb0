"""Hybrid models in the simulator: decode throughput and lanes, dense against lookahead, at 16K and 32K.

For each preset (``--models``) and context, a closed loop of ``--requests`` requests (prompt = the context, ``--output``
tokens each) runs on one H200 (``h200``: its HBM less the weights, 0.9 of its 128 GiB host) in ``dense`` and in
``lookahead`` (K = 128, S = K, fetch cap 5%, synthetic selections, preset ``paper``), every prefill that fits in one
step (as the bench's closed loop), so that the lanes are bound by memory. Reported per run: the most
requests decoding in one step (lanes), the decode throughput over the steps without prefill (emitted tokens / their
time), the median such step, host->GPU MB a decode step, HBM and host peaks. Writes ``results/capacity_<commit>.md``
and ``.json``. CPU only, a few minutes.

    python experiments/hybrid_models/hybrid_capacity.py [--models gemma3-27b gpt-oss-120b ...] [--contexts 16384 32768]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from oasis_core import provenance  # noqa: E402
from oasis_sim.config import SimConfig  # noqa: E402
from oasis_sim.sim import simulate  # noqa: E402
from oasis_sim.workloads import uniform_trace  # noqa: E402

OUT = Path(__file__).resolve().parent / "results"


def one(model: str, ctx: int, mode: str, requests: int, output: int) -> dict:
    cfg = SimConfig(
        model=model,
        hardware="h200",
        mode=mode,
        concurrency=requests,
        max_batch=max(256, requests),
        chunk_tokens=requests * ctx,  # every prefill that fits in one step, as the bench: lanes bound by memory
        timeline_steps=0,
    )
    t = time.perf_counter()
    res = simulate(cfg, uniform_trace(requests, ctx, output))
    log, s = res.steps, res.summary
    dec = [i for i in range(len(log.dur)) if log.prefill[i] == 0 and log.decode[i] > 0]
    durs = [log.dur[i] for i in dec]
    return {
        "model": model,
        "context": ctx,
        "mode": mode,
        "lanes": max(log.decode),
        "decode_tok_s": round(sum(log.emitted[i] for i in dec) / sum(durs), 1) if dec else None,
        "decode_step_ms_p50": round(1e3 * statistics.median(durs), 3) if dec else None,
        "h2d_mb_per_decode_step": round(sum(log.h2d[i] for i in dec) / len(dec) / 1e6, 2) if dec else None,
        "hbm_peak_gb": round(s["hbm_peak_bytes"] / 1e9, 2),
        "host_peak_gb": round(s["host_peak_bytes"] / 1e9, 2),
        "preemptions": s["preemptions"],
        "completed": s["requests_completed"],
        "wall_s": round(time.perf_counter() - t, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gemma3-270m", "gemma3-27b", "gpt-oss-120b", "qwen3-8b"])
    ap.add_argument("--contexts", nargs="+", type=int, default=[16384, 32768])
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--output", type=int, default=128)
    a = ap.parse_args()
    commit = provenance.commit()
    rows = []
    for model in a.models:
        for ctx in a.contexts:
            for mode in ("dense", "lookahead"):
                rows.append(one(model, ctx, mode, a.requests, a.output))
                print(json.dumps(rows[-1]), flush=True)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    head = (
        f"Simulated {date} at commit {commit} (oasis_sim, roofline predictor, `h200` preset; dummy: no weights, "
        f"synthetic selections, preset paper; closed loop of {a.requests} requests x {a.output} output tokens, "
        "prefills in one step; lanes = the most requests decoding in one step).\n\n"
        "| model | context | mode | lanes | decode tok/s | decode step ms | MB / step | HBM peak GB | host peak GB |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = [
        f"| {r['model']} | {r['context']:,} | {r['mode']} | {r['lanes']} | {r['decode_tok_s']:,} | "
        f"{r['decode_step_ms_p50']} | {r['h2d_mb_per_decode_step']} | {r['hbm_peak_gb']} | {r['host_peak_gb']} |"
        for r in rows
    ]
    OUT.mkdir(exist_ok=True)
    (OUT / f"capacity_{commit}.md").write_text(head + "\n".join(lines) + "\n")
    (OUT / f"capacity_{commit}.json").write_text(json.dumps({"date": date, "commit": commit, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
