"""The simulator's TP=1 and TP=2 step times for the runs of ``steps/tp2.sh``, made before any of them ran (the
runs need ``nvidia-h200-x2``): each configuration replayed as the bench would record it (``oasis_sim.replay``:
closed loop, synthesized prefill, the timed window), Qwen3-8B shape, H200, 16K, 16 and 32 requests, lookahead and
dense, synthetic ``smollm2`` preset. Once the step has run, ``python -m oasis_sim validate OUT/rec`` scores the same
simulator against the recordings.

    python experiments/two_gpu_split/tp_predict.py

writes ``results/tp_sim_prediction.{json,md}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.common import reporting as common  # noqa: E402

HERE = Path(__file__).resolve().parent
PLACEHOLDER = {  # the shell recording's results: replay reads only its configuration
    "tpot_ms_p50": 1.0,
    "tpot_ms_p99": 1.0,
    "throughput_tok_s": 1.0,
    "ttft_ms_p50": None,
    "stage_ms_per_step": {},
    "bytes_per_step": {"pcie_h2d": 0.0},
    "stall_ms_per_step": None,
    "hidden_fraction": None,
    "device": "none (prediction)",
    "date": "2026-12-01T00:00:00+00:00",
    "commit": "none",
}


def predict(mode: str, tp: int, n: int) -> dict:
    from oasis_core.recording import build_recording
    from oasis_sim.replay import replay

    c = {
        "mode": mode,
        "model": "qwen3-8b",
        "hardware": "h200",
        "workload": "closed-loop",
        "context": 16384,
        "concurrency": n,
        "kv_budget_gb": 52.0,
        "top_k": 128,
        "block_size": 16,
        "fetch_ratio": 0.05,
        "transfer_path": None if mode == "dense" else "uva",
        "selection": "synthetic",
        "synthetic": {"preset": "smollm2"},
        "seed": 0,
        "warmup_steps": 5,
        "steps": 32,
    }
    if tp > 1:
        c["tensor_parallel"] = tp
    p = replay(build_recording(c, dict(PLACEHOLDER))).predicted
    return {
        "mode": mode,
        "tensor_parallel": tp,
        "concurrency": n,
        "tpot_ms_p50": p["tpot_ms_p50"],
        "throughput_tok_s": p["throughput_tok_s"],
        "pcie_h2d_bytes_per_step": p["pcie_h2d_bytes_per_step"],
    }


def main() -> int:
    prov = common.provenance()
    rows = [predict(m, tp, n) for n in (16, 32) for m in ("lookahead", "dense") for tp in (1, 2)]
    lines = [
        "# The simulator's TP step times before the two-H200 run (Qwen3-8B shape, H200, 16K, synthetic smollm2)",
        "",
        common.provenance_md(prov),
        "Simulator only (no device, no weights; synthetic selection): rank 0's share of the model plus two ring "
        "all-reduces a layer over NVLink 4 (450 GB/s a direction x 0.8, 15 us each: unfitted). Measured: none yet "
        "(`steps/tp2.sh` needs nvidia-h200-x2, withheld).",
        "",
        "| mode | requests | TP | TPOT ms | tok/s | host->GPU MB a step (rank 0) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['concurrency']} | {r['tensor_parallel']} | {r['tpot_ms_p50']:.2f} | "
            f"{r['throughput_tok_s']:.0f} | {r['pcie_h2d_bytes_per_step'] / 1e6:.1f} |"
        )
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "tp_sim_prediction.json").write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    (out / "tp_sim_prediction.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
