"""What scoring a prompt through the server costs against transformers, on the CPU (issue 41).

The real SmolLM2-135M (its GGUF), float32, one thread in both. Per prompt length T: the wall time of one
`/v1/completions` request with `echo`, `logprobs` 1 and `max_tokens` 1 (lm-eval's loglikelihood request) and with
`max_tokens` 0, through `python -m oasis_exec serve --mode dense` (client included), against transformers' forward
over the same T tokens plus its log-softmax and the gather of the T log-probabilities; medians of --reps requests
(after one warm-up). The server's scores are checked against transformers' (max |diff|) on the way.

    python experiments/eval_harness/cost.py --lengths 16 256 1024 2047 --reps 5

Writes experiments/eval_harness/results/cost.json (date, commit, machine, figures).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "helpers")]


def hf_once(model, ids):
    """transformers: forward, log-softmax, the T - 1 prompt log-probabilities; (seconds, them)."""
    import torch

    t = time.perf_counter()
    with torch.inference_mode():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        got = lp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return time.perf_counter() - t, got


def server_once(base_url, ids, max_tokens):
    """One echo + logprobs request, client included; (seconds, its token_logprobs)."""
    import httpx

    body = {"model": "m", "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1, "echo": True}
    t = time.perf_counter()
    r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=600)
    dt = time.perf_counter() - t
    r.raise_for_status()
    return dt, r.json()["choices"][0]["logprobs"]["token_logprobs"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 256, 1024, 2047])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "experiments/eval_harness/results/cost.json"))
    args = ap.parse_args()

    import torch
    import transformers
    from server_proc import ServerProcess

    from oasis_exec.model.gguf import smollm2_path

    torch.set_num_threads(1)
    gguf = smollm2_path()
    d, name = os.path.split(gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    import shlex

    text = open(shlex.__file__, encoding="utf-8").read() * 4
    base = tok.encode(text)
    ctx = max(args.lengths) + 1
    srv = ServerProcess(
        *("--model", gguf, "--device", "cpu", "--dtype", "float32", "--mode", "dense", "--max-context", str(ctx)),
        *("--served-model-name", "m"),
        start_timeout_s=300,
    )
    rows = []
    try:
        for T in args.lengths:
            ids = base[:T]

            hf_once(model, ids), server_once(srv.base_url, ids, 1)  # warm-up
            hf = [hf_once(model, ids) for _ in range(args.reps)]
            s1 = [server_once(srv.base_url, ids, 1) for _ in range(args.reps)]
            s0 = [server_once(srv.base_url, ids, 0) for _ in range(args.reps)]
            ref = hf[0][1].tolist()
            diff = max(abs(a - b) for a, b in zip(s1[0][1][1:T], ref))
            row = {
                "T": T,
                "transformers_s": statistics.median(x[0] for x in hf),
                "server_max_tokens_1_s": statistics.median(x[0] for x in s1),
                "server_max_tokens_0_s": statistics.median(x[0] for x in s0),
                "max_abs_logprob_diff_vs_transformers": diff,
            }
            row["overhead_max_tokens_1_s"] = row["server_max_tokens_1_s"] - row["transformers_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        srv.stop()
    from oasis_core import provenance

    commit = provenance.commit()
    doc = {
        "what": "echo + logprobs scoring through the server (dense, max_tokens 1 and 0) vs transformers' forward",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores (shared), 1 torch thread each",
        "model": "SmolLM2-135M-Instruct Q4_1 GGUF, float32 (real weights)",
        "reps": args.reps,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
