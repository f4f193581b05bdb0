"""Tensor parallelism on the CPU: two processes over gloo (``oasis_exec.model.tensor_parallel``) give the one-process
greedy output, with the tiny dummy preset and with the real model (SmolLM2-135M: 3 KV heads over 2 ranks, split
2 + 1), in dense and in lookahead with a real selection (top-K below the context). fp32: the logits differ by the
order of the partial sums only (the all-reduce adds two partial matmuls), tolerance ``tp_cases.LOGIT_TOL``; the tokens are
equal."""

from __future__ import annotations

import dataclasses

import pytest
from real_model_cases import shlex_ids
from tp_cases import TINY_PROMPTS, same_as_one_rank

from oasis_exec.config import ExecConfig
from oasis_exec.model import tensor_parallel as tp

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_head_split_uneven_and_refused():
    assert tp.head_split(3, 2) == [(0, 2), (2, 3)]
    assert tp.head_split(8, 2) == [(0, 4), (4, 8)]
    assert tp.head_split(1536, 2) == [(0, 768), (768, 1536)]
    with pytest.raises(ValueError, match="a rank would own none"):
        tp.head_split(1, 2)


def test_shard_slices_heads_and_mlp():
    import torch

    from oasis_core.specs import get_model
    from oasis_exec.model.decoder import random_weights

    shape = dataclasses.replace(get_model("tiny"), n_q_heads=6, n_kv_heads=3)
    w = random_weights(shape, 0, torch.float32)
    parts = [tp.TPGroup(2, r).shard(shape, w) for r in (0, 1)]
    assert [(s.n_q_heads, s.n_kv_heads, s.mlp_hidden) for s, _ in parts] == [(4, 2, 64), (2, 1, 64)]
    name = "model.layers.0.self_attn."
    d = shape.head_dim
    for part in ("q_proj", "o_proj"):
        dim = 0 if part == "q_proj" else 1
        got = torch.cat([p[name + part + ".weight"] for _, p in parts], dim)
        assert torch.equal(got, w[name + part + ".weight"])
    assert parts[1][1][name + "k_proj.weight"].shape == (d, shape.hidden)
    assert parts[0][1]["model.embed_tokens.weight"] is w["model.embed_tokens.weight"]  # replicated


def test_config_refuses_more_ranks_than_kv_heads():
    with pytest.raises(ValueError, match="tensor_parallel"):
        ExecConfig(model="tiny", device="cpu", tensor_parallel=3)  # tiny has 2 KV heads
    with pytest.raises(RuntimeError, match="torch.distributed"):
        tp.group(2)


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_tp2_equals_tp1_tiny(mode):
    cfg = ExecConfig(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode=mode,
        block_size=4,
        top_k=3,
        max_context=128,
        short_context=False,
    )
    ref, outs = same_as_one_rank(cfg, TINY_PROMPTS, 16)
    assert [(o["kv_heads"], o["q_heads"]) for o in outs] == [(1, 2), (1, 2)]
    if mode == "lookahead":  # each rank holds the host copy of its own KV heads: half the pool
        assert sum(o["host_pool_bytes"] for o in outs) == ref["host_pool_bytes"]


@pytest.fixture(scope="module")
def smollm2():
    from oasis_exec.model.gguf import smollm2_path

    try:
        return smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.slow
def test_tp2_equals_tp1_real_model(smollm2):
    """SmolLM2-135M, lookahead, top-K 4 of ~20 blocks (a real selection from the real summaries): rank 0 owns KV
    heads 0-1 (query heads 0-5), rank 1 KV head 2 (query heads 6-8)."""
    ids = shlex_ids(smollm2, 300)
    cfg = ExecConfig(
        model_path=smollm2,
        device="cpu",
        dtype="float32",
        mode="lookahead",
        block_size=16,
        top_k=4,
        max_context=512,
        short_context=False,
        block_score="minmax_sum+sink",  # block_score=auto's shipped basis is not split over ranks
    )
    ref, outs = same_as_one_rank(cfg, [ids], 24)
    assert [(o["kv_heads"], o["q_heads"], o["mlp_hidden"]) for o in outs] == [(2, 6, 768), (1, 3, 768)]
    assert sum(o["host_pool_bytes"] for o in outs) == ref["host_pool_bytes"]


def test_bench_cli_tensor_parallel(tmp_path):
    """``python -m oasis_exec bench --tensor-parallel 2`` spawns two ranks; the record is rank 0's, with the ranks'
    bytes summed under ``all_ranks`` and each rank's own record under ``ranks``."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "rec.jsonl"
    cmd = [sys.executable, "-m", "oasis_exec", "bench", "--model", "tiny", "--dummy", "--device", "cpu", "--dtype"]
    cmd += ["float32", "--mode", "lookahead", "--context", "256", "--concurrency", "2", "--steps", "3"]
    cmd += ["--warmup", "1", "--top-k", "4", "--tensor-parallel", "2", "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=120)
    (rec,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert rec["tensor_parallel"] == 2 and [r["tp_rank"] for r in rec["ranks"]] == [0, 1]
    assert [r["kv_heads"] for r in rec["ranks"]] == [1, 1]
    assert rec["all_ranks"]["host_pool_bytes"] == sum(r["host_pool_bytes"] for r in rec["ranks"]) > 0
    assert rec["all_ranks"]["bytes_moved_total"] == sum(r["bytes_moved_total"] for r in rec["ranks"])
    assert rec["host_pool_bytes"] == rec["ranks"][0]["host_pool_bytes"]  # rank 0's own, as the simulator's
