"""Do trained heads learn their training text rather than the target? (issue 37, 2026-12-06)

Acceptance (draft top-1 = the target's) of each head on the first ``--positions`` positions of the first
``--windows`` training windows and held-out windows of a data file, through the evaluation path
(``accept_buckets.score``: the head's own sequence forward and ``_ids``); for the first head also through the training
path (``train_long.acceptance_at``) on the same rows. Equal figures by the two paths mean they agree; a gap between the
training and the held-out rows means the head fits its text.

    python experiments/long_context_draft/train_vs_held.py --model-path gemma-3-270m-q4_k_m.gguf \\
        --data experiments/long_context_draft/data/gemma_32k.npz --positions 1024 --windows 2 \\
        experiments/long_context_draft/heads/gemma-attn-32k
"""

import argparse
import os
import sys

import torch

D = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [D, os.path.dirname(os.path.dirname(D))]
from accept_buckets import rates, score  # noqa: E402
from longctx import Target, load_data, load_head  # noqa: E402
from train_long import acceptance_at  # noqa: E402


def training_path(tgt: Target, head, s) -> float:
    """The head's acceptance at every entry of ``s`` through the training path (``train_long.acceptance_at``)."""
    return acceptance_at(tgt, "attn", head.attn, s, torch.arange(s.shape[0] * (s.shape[1] - 1)))(head.w)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("heads", nargs="+", help="head directories (name = the folder's name)")
    a = ap.parse_args(argv)
    tgt = Target(a.model_path, "cpu", torch.float32)
    data = load_data(a.data)
    heads = {
        os.path.basename(p.rstrip("/")): load_head(p, tgt.spec, tgt, torch.float32, "cpu", a.positions) for p in a.heads
    }
    first = next(iter(heads))
    for name in ("train", "held"):
        s = torch.as_tensor(data[name][: a.windows, : a.positions])
        r = rates(score(tgt, heads, s))
        cells = ", ".join(
            f"{h} {100 * sum(v['acceptance'] * v['positions'] for v in r[h].values()) / sum(v['positions'] for v in r[h].values()):.1f}%"
            for h in heads
        )
        print(f"{name} windows: evaluation path {cells}", flush=True)
        if getattr(heads[first], "attends", False):
            print(f"{name} windows: training path {first} {100 * training_path(tgt, heads[first], s):.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
