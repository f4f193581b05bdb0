"""Greedy generation through the engine, a rank's share of it under ``tensor_parallel.launch``: what the
tensor-parallel and prefill/decode split checks compare with a one-rank run (``tests/helpers/tp_cases.py``,
``experiments/two_gpu_split``)."""

from __future__ import annotations

import torch

from ..engine.engine import Engine
from ..engine.scheduler import SamplingParams


def generate_greedy(cfg, prompts, max_tokens: int) -> dict:
    """Greedy generation of ``prompts`` on an engine of ``cfg`` (this rank's, under ``launch``): ``{"tokens": [ids a
    prompt], "logits": [float32 [steps, V] a prompt], "rank", "kv_heads", "q_heads", "host_pool_bytes"}``; the
    logits are each step's, for comparing a tensor-parallel run with a one-rank one."""
    eng = Engine(cfg)
    try:
        ids = [eng.add_request(p, SamplingParams(max_tokens=max_tokens)) for p in prompts]
        toks, logits = {i: [] for i in ids}, {i: [] for i in ids}
        while eng.has_work():
            for o in eng.step():
                toks[o.request_id].extend(o.new_token_ids)
            for rid, row in eng.runner.last_logits.items():
                logits[rid].append(row.float().cpu())
        r = eng.runner
        return {
            "tokens": [toks[i] for i in ids],
            "logits": [torch.stack(logits[i]) for i in ids],
            "rank": r.tp.rank if r.tp is not None else 0,
            "kv_heads": r.shape.n_kv_heads,
            "q_heads": r.shape.n_q_heads,
            "mlp_hidden": r.shape.mlp_hidden,
            "host_pool_bytes": r.host.nbytes if r.host is not None else 0,
        }
    finally:
        eng.close()
