"""What the attention draft layer costs a decode step, beside the single-key head: its K/V bytes (a lane, and read
a step) and the time of one proposal for B lanes at a context of N positions (random weights: the cost does not
depend on them), at the model presets' shapes (``oasis_core.specs``: smollm2-135m, qwen3-8b) and Gemma 3 270M's
(hidden 640, 4 query heads, 1 KV head of 256).

    python experiments/long_context_draft/draft_cost.py --device cuda      # the H200 (steps/train_*.sh run it)
    python experiments/long_context_draft/draft_cost.py --device cpu --lanes 1 4 --contexts 2048 --iters 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE))]

from oasis_core.specs import ModelSpec, get_model  # noqa: E402
from oasis_exec.model.draft import DraftHead  # noqa: E402
from oasis_exec.model.draft_attn import AttnDraftHead  # noqa: E402

GEMMA = ModelSpec(
    name="gemma-3-270m", n_layers=18, n_q_heads=4, n_kv_heads=1, head_dim=256, hidden=640, mlp_hidden=2048,
    vocab=262144, max_context_tokens=32768, rope_theta=1e6, tie_embeddings=True,
)  # fmt: skip


def _time(fn, iters: int, dev) -> float:
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma-3-270m", "qwen3-8b"])
    ap.add_argument("--lanes", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--contexts", nargs="+", type=int, default=[8192, 32768])
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    print(f"device {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, {dt}, random weights, "
          f"draft vocabulary = the target's (tied LM head)")  # fmt: skip
    print(f"{'model':>14} {'N':>6} {'B':>4} | {'KV MiB/lane':>11} {'MB read/step':>12} | {'attn ms':>8} "
          f"{'single ms':>9} | {'target KV MiB/lane (all layers dense)':>18}")  # fmt: skip
    for name in a.models:
        s = GEMMA if name == GEMMA.name else get_model(name)
        g = torch.Generator(device=dev).manual_seed(0)
        embed = (torch.randn(s.vocab, s.hidden, generator=g, device=dev) / 8).to(dt)
        single = DraftHead.build(s, embed, None, s.vocab, 1, dt, dev, lm_head=embed)
        for n in a.contexts:
            for b in a.lanes:
                head = AttnDraftHead.build(s, embed, None, s.vocab, 1, dt, dev, embed, max_lanes=b, max_len=n)
                head.kv.n[:] = n - 2  # lanes near their end: the masked read covers the whole buffer anyway
                lanes = torch.arange(b, device=dev)
                aux = torch.randn(b, 3 * s.hidden, generator=g, device=dev).to(dt)
                tok = torch.randint(0, s.vocab, (b,), generator=g, device=dev)

                def step(head=head, lanes=lanes, aux=aux, tok=tok, n=n):
                    head.kv.n[lanes] = n - 2
                    head.propose_lanes(lanes, aux, tok)

                t_attn = _time(step, a.iters, dev)
                t_single = _time(lambda h=single, x=aux, t=tok: h.propose(x, t), a.iters, dev)
                kv_lane = head.kv.bytes_per_lane / 2**20
                target = s.n_layers * 2 * s.n_kv_heads * s.head_dim * 2 * n / 2**20
                print(f"{name:>14} {n:>6} {b:>4} | {kv_lane:11.2f} {head.kv.bytes_per_step(b) / 1e6:12.2f} | "
                      f"{1e3 * t_attn:8.3f} {1e3 * t_single:9.3f} | {target:18.1f}")  # fmt: skip
                del head
    return 0


if __name__ == "__main__":
    sys.exit(main())
