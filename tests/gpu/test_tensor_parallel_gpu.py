"""Tensor parallelism on two GPUs (NCCL, ``NCCL_NVLS_ENABLE=0``): TP=2 greedy output equals TP=1, eagerly and with
the decode steps captured as CUDA graphs (the all-reduces inside the graphs), with the tiny dummy preset and, when
``OASIS_GGUF`` names it (``experiments/device.sh``'s ``need_model``), the real model (3 KV heads split 2 + 1). fp32
without the fused kernels, so the tolerance is the CPU test's."""

from __future__ import annotations

import os

import pytest
import torch
from tp_cases import TINY_PROMPTS, same_as_one_rank

from oasis_exec.config import ExecConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"),
]


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_tp2_equals_tp1_tiny_cuda(mode, graphs):
    cfg = ExecConfig(
        model="tiny",
        device="cuda",
        dtype="float32",
        mode=mode,
        block_size=16,  # the GPU kernels' tl.dot needs >= 16 keys a tile (4-token blocks compile on the CPU only)
        top_k=2,  # of the 40-token prompt's 3 full blocks after 16 tokens: sparse
        max_context=128,
        short_context=False,
        fused_ops=False,
        cuda_graph=graphs,
        transfer="uva",
    )
    same_as_one_rank(cfg, TINY_PROMPTS, 16, "nccl")


@pytest.mark.skipif(not os.environ.get("OASIS_GGUF"), reason="OASIS_GGUF: the SmolLM2 GGUF")
def test_tp2_equals_tp1_real_model_cuda():
    ids = [(37 * j) % 40000 + 100 for j in range(300)]
    cfg = ExecConfig(
        model_path=os.environ["OASIS_GGUF"],
        device="cuda",
        dtype="float32",
        mode="lookahead",
        top_k=4,
        max_context=512,
        short_context=False,
        fused_ops=False,
        transfer="uva",
        block_score="minmax_sum+sink",  # block_score=auto's shipped basis is not split over ranks
    )
    same_as_one_rank(cfg, [ids], 24, "nccl")
