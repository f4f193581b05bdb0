"""What the CPU (gloo) and the GPU (NCCL) tensor-parallel tests share: the tiny case and the TP=2-against-TP=1
check."""

import dataclasses

from oasis_exec.model import tensor_parallel as tp
from oasis_exec.tools.tp_generate import generate_greedy

LOGIT_TOL = 1e-3  # fp32 logits of magnitude ~10: measured 1e-6 (tiny) and ~1e-5 (SmolLM2) apart on the CPU
TINY_PROMPTS = [[(3 * j + 1) % 200 + 1 for j in range(40)], [(5 * j + 2) % 200 + 1 for j in range(23)]]


def same_as_one_rank(cfg, prompts, n, backend="gloo"):
    """Greedy ``n`` tokens of ``prompts`` on one rank and on two (``backend``); asserts every rank's tokens equal the
    one-rank run's and their logits are within ``LOGIT_TOL``. Returns (one-rank result, [rank results])."""
    ref = generate_greedy(cfg, prompts, n)
    two = dataclasses.replace(cfg, tensor_parallel=2)
    outs = tp.launch(generate_greedy, 2, two, prompts, n, backend=backend, every_rank=True)
    for o in outs:  # every rank samples the same tokens from the same all-reduced logits
        assert o["tokens"] == ref["tokens"]
        for a, b in zip(o["logits"], ref["logits"]):
            assert a.shape == b.shape
            assert float((a - b).abs().max()) < LOGIT_TOL
    return ref, outs
