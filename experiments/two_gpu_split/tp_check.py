"""Tensor parallelism on the CPU: TP=2 (two processes over gloo) against TP=1, greedy, fp32, with the real model
(SmolLM2-135M: 3 KV heads, split 2 + 1) and the tiny dummy preset, in dense and in lookahead with the model's own
selection (top-K below the context). Records the tokens' equality, the largest logit difference and each rank's
share.

    python experiments/two_gpu_split/tp_check.py [--tokens 64]

writes ``results/tp_cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.common import reporting as common  # noqa: E402

HERE = Path(__file__).resolve().parent
TEXT = common.REPO / "traces" / "texts" / "shlex.py.txt"


def compare(name, cfg, prompts, n, weights) -> dict:
    from oasis_exec.model import tensor_parallel as tp
    from oasis_exec.tools.tp_generate import generate_greedy

    t0 = time.perf_counter()
    one = generate_greedy(cfg, prompts, n)
    t1 = time.perf_counter()
    two = tp.launch(generate_greedy, 2, dataclasses.replace(cfg, tensor_parallel=2), prompts, n, every_rank=True)
    t2 = time.perf_counter()
    diff = max(float((a - b).abs().max()) for o in two for a, b in zip(o["logits"], one["logits"]))
    scale = max(float(x.abs().max()) for x in one["logits"])
    return {
        "case": name,
        "weights": weights,
        "mode": cfg.mode,
        "top_k": cfg.top_k,
        "prompt_tokens": [len(p) for p in prompts],
        "tokens_out": n,
        "tokens_equal": all(o["tokens"] == one["tokens"] for o in two),
        "max_abs_logit_diff": diff,
        "max_abs_logit": scale,
        "ranks": [{k: o[k] for k in ("rank", "kv_heads", "q_heads", "mlp_hidden", "host_pool_bytes")} for o in two],
        "one_rank": {k: one[k] for k in ("kv_heads", "q_heads", "mlp_hidden", "host_pool_bytes")},
        "wall_s": {"tp1": t1 - t0, "tp2": t2 - t1},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from oasis_exec.config import ExecConfig
    from oasis_exec.model.gguf import sha256_file, smollm2_path
    from oasis_exec.server.tokenizer import load_tokenizer

    prov = common.provenance()
    rows = []
    tiny = [[(3 * j + 1) % 200 + 1 for j in range(120)], [(5 * j + 2) % 200 + 1 for j in range(77)]]
    for mode in ("dense", "lookahead"):
        cfg = ExecConfig(
            model="tiny",
            device="cpu",
            dtype="float32",
            mode=mode,
            block_size=4,
            top_k=6,
            max_context=256,
            short_context=False,
        )
        rows.append(compare(f"tiny {mode}", cfg, tiny, a.tokens, "dummy (seed 0)"))
    model = smollm2_path()
    ids = load_tokenizer(model).encode(TEXT.read_text())[:1024]
    weights = f"real: {os.path.basename(model)} sha256 {sha256_file(model)[:16]}"
    for mode, k in (("dense", 128), ("lookahead", 16)):
        cfg = ExecConfig(
            model_path=model,
            draft_path=str(common.REPO / "experiments/trained_draft_head/smollm2-eagle3"),
            device="cpu",
            dtype="float32",
            mode=mode,
            top_k=k,
            max_context=1024 + a.tokens + 32,
            short_context=False,
        )
        rows.append(compare(f"SmolLM2 {mode}", cfg, [ids], a.tokens, weights))
    res = {"provenance": prov, "device": "CPU, two processes over gloo", "selection": "model", "rows": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tp_cpu.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [
        "# TP=2 against TP=1 on the CPU (gloo), greedy, fp32",
        "",
        common.provenance_md(prov),
        f"Device: {res['device']}. Selection: the model's own (lookahead: the trained draft head's query; "
        f"SmolLM2 prompt: {TEXT.relative_to(common.REPO)}, first 1,024 tokens).",
        "",
        "| case | weights | top-K | tokens out | equal | max abs logit diff (max abs logit) | rank KV / q heads, MLP | "
        "host pool B: ranks / one rank |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        heads = "; ".join(f"{x['kv_heads']} / {x['q_heads']}, {x['mlp_hidden']}" for x in r["ranks"])
        pools = " + ".join(str(x["host_pool_bytes"]) for x in r["ranks"])
        lines.append(
            f"| {r['case']} | {r['weights']} | {r['top_k']} | {r['tokens_out']} | {r['tokens_equal']} | "
            f"{r['max_abs_logit_diff']:.2e} ({r['max_abs_logit']:.1f}) | {heads} | {pools} / "
            f"{r['one_rank']['host_pool_bytes']} |"
        )
    (out / "tp_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
