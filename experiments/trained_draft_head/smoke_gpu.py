"""GPU smoke check of the real model in every mode: greedy continuations of a real prompt, bf16, K covering every
block (sparse must equal dense up to bf16 near-ties) and K = 12.5% of the blocks. Prints one JSON line per mode.

    python experiments/trained_draft_head/smoke_gpu.py MODEL.gguf TEXT [--draft-path DIR] [--prompt-tokens 1000]
"""

import argparse
import json
import os
import time

from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("text")
ap.add_argument("--draft-path", default=None)
ap.add_argument("--prompt-tokens", type=int, default=1000)
ap.add_argument("--new", type=int, default=64)
a = ap.parse_args()
from transformers import AutoTokenizer  # noqa: E402

tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(a.model)), gguf_file=os.path.basename(a.model))
ids = tok(open(a.text).read(), add_special_tokens=False).input_ids[: a.prompt_tokens]
ctx = a.prompt_tokens + a.new + 32
n_blocks = -(-ctx // 16)
ref = None
for top_k in (n_blocks, max(1, n_blocks // 8)):
    for mode in ("dense", "quest", "proxy", "retrieval", "lookahead"):
        if mode == "dense" and ref is not None:
            continue
        cfg = ExecConfig(
            model_path=a.model,
            device="cuda",
            mode=mode,
            max_context=ctx,
            top_k=top_k,
            draft_path=a.draft_path,
            max_lanes=2,
        )
        t0 = time.time()
        eng = Engine(cfg)
        out = eng.generate([ids], SamplingParams(max_tokens=a.new))[0]
        eng.close()
        if mode == "dense":
            ref = out
        same = next((i for i, (x, y) in enumerate(zip(out, ref)) if x != y), len(out))
        print(
            json.dumps(
                {
                    "mode": mode,
                    "top_k": top_k,
                    "n_blocks": n_blocks,
                    "first_divergence": same,
                    "tokens": len(out),
                    "s": round(time.time() - t0, 2),
                    "text": tok.decode(out)[:120],
                }
            ),
            flush=True,
        )
