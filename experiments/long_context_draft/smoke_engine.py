"""The engine on SmolLM2 (the installed GGUF) with either draft head: dense, then lookahead with the attention head
(``--draft-head attn``: random weights unless ``--attn-path``) and the single-key head (today's trained one), K
covering every block (outputs must equal dense's) and K = 8. One JSON line a run; ``draft_kv_len`` is the attention
head's K/V length after the run (prompt + produced - 1).

    python experiments/long_context_draft/smoke_engine.py --device cpu --dtype float32 --prompt 600 --new 16
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE))]

from oasis_exec.config import ExecConfig  # noqa: E402
from oasis_exec.engine.engine import Engine  # noqa: E402
from oasis_exec.engine.scheduler import SamplingParams  # noqa: E402
from oasis_exec.model.gguf import smollm2_path  # noqa: E402
from oasis_exec.tools.quality.texts import hf_tokenizer, token_ids  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--model-path", default=None)
ap.add_argument("--device", default="cpu")
ap.add_argument("--dtype", default="float32")
ap.add_argument("--prompt", type=int, default=600)
ap.add_argument("--new", type=int, default=16)
ap.add_argument("--attn-path", default=None)
ap.add_argument("--single-path", default=os.path.join(HERE, "..", "trained_draft_head", "smollm2-eagle3"))
a = ap.parse_args()
M = a.model_path or smollm2_path()
ids = token_ids(hf_tokenizer(M), "GPL-3", a.prompt)
ctx = len(ids) + a.new + 32
nb = -(-ctx // 16)
ref = None
for mode, head, k in (("dense", "single", nb), ("lookahead", "attn", nb), ("lookahead", "attn", 8),
                      ("lookahead", "single", 8)):  # fmt: skip
    path = a.attn_path if head == "attn" else a.single_path
    cfg = ExecConfig(model_path=M, device=a.device, dtype=a.dtype, mode=mode, max_context=ctx, top_k=k, max_lanes=1,
                     draft_head=head, draft_path=path, prefill_chunk=256)  # fmt: skip
    t0 = time.time()
    eng = Engine(cfg)
    out = eng.generate([ids], SamplingParams(max_tokens=a.new))[0]
    n = int(eng.runner.drafts.head.kv.n[0]) if head == "attn" and mode == "lookahead" else None
    eng.close()
    ref = ref or out
    print(json.dumps({"mode": mode, "draft_head": head, "top_k": k, "n_blocks": nb, "same_as_dense": out == ref,
                      "draft_kv_len": n, "s": round(time.time() - t0, 1)}), flush=True)  # fmt: skip
