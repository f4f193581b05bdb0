"""Does a trained head learn its training text rather than the target? (issue 37, 2026-12-06)

Acceptance of one head on the first ``L`` positions of two training windows and two held-out windows, through the
evaluation path (``accept_buckets.score``: the head's own sequence forward and ``_ids``) and, on the same rows, the
training path (``longctx.train_logits``): equal figures on the training rows mean the two paths agree, and a gap
between training and held-out rows means the head fits its text.

    python experiments/long_context_draft/train_vs_held.py gemma-3-270m-q4_k_m.gguf \
        experiments/long_context_draft/data/gemma_32k.npz experiments/long_context_draft/heads/gemma-attn-32k 1024
"""

import os
import sys

import torch

D = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [D, os.path.dirname(os.path.dirname(D))]
from accept_buckets import rates, score  # noqa: E402
from longctx import Target, load_data, load_head, train_logits  # noqa: E402


def main(model_path: str, data_path: str, head_path: str, n: int) -> None:
    tgt = Target(model_path, "cpu", torch.float32)
    data = load_data(data_path)
    head = load_head(head_path, tgt.spec, tgt, torch.float32, "cpu", n)
    for name, rows in (("train", data["train"][:2, :n]), ("held", data["held"][:2, :n])):
        s = torch.as_tensor(rows)
        r = rates(score(tgt, {"h": head}, s))
        pct = {b: round(100 * v["acceptance"], 1) for b, v in r["h"].items()}
        print(f"{name}: evaluation path {pct}", flush=True)
        aux, hn = tgt.features(s)
        T = s.shape[1]
        pick = torch.arange(s.shape[0] * (T - 1))
        w = {k: v.float() for k, v in head.w.items()}
        with torch.no_grad():
            lg = train_logits(w, "attn", head.attn, tgt.spec, aux[:, : T - 1], tgt.embed[s[:, 1:]], pick, tgt.lm_head)
            want = tgt.logits(hn[pick // (T - 1), pick % (T - 1) + 1]).argmax(-1)
        print(f"{name}: training path {100 * (lg.argmax(-1) == want).float().mean().item():.1f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
