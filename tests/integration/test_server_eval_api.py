"""What evaluation harnesses ask of the server beside scoring (issue 41): batches of prompts in `/v1/completions`,
the tokenizer API (`/tokenize`, `/detokenize`, `/tokenizer_info`, vLLM's shapes), and `usage` counting what was
returned. The tiny dummy model on the CPU (byte tokenizer), in this process."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
import httpx
from exec_cases import cfg, prompts
from server_fakes import serve_app

from oasis_exec.engine.engine import Engine
from oasis_exec.server.adapter import ExecutorEngine
from oasis_exec.server.app import create_app
from oasis_exec.server.config import ServerConfig
from oasis_exec.server.tokenizer import ByteTokenizer

PROMPTS = prompts(seed=5, lens=(20, 33, 9))


@pytest.fixture(scope="module")
def url():
    engine = ExecutorEngine(Engine(cfg("dense", decode_chain=8, max_lanes=4)))
    with serve_app(create_app(engine, ByteTokenizer(), ServerConfig(port=0, api_key="k"))) as u:
        yield u


def _post(url, path, body, key="k"):
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=300)


def _complete(url, **body):
    r = _post(url, "/v1/completions", {"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_batch_of_prompts_is_one_choice_each_in_order(url):
    one = [_complete(url, prompt=p, max_tokens=5, temperature=0)["choices"][0]["text"] for p in PROMPTS]
    batch = _complete(url, prompt=PROMPTS, max_tokens=5, temperature=0)
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2]
    assert [c["text"] for c in batch["choices"]] == one
    assert batch["usage"] == {"prompt_tokens": 62, "completion_tokens": 15, "total_tokens": 77}
    texts = ["Hello", "abc"]
    got = _complete(url, prompt=texts, max_tokens=2, temperature=0, echo=True)["choices"]
    assert [c["text"][: len(t)] for c, t in zip(got, texts)] == texts
    # lm-eval's loglikelihood batch: echo, logprobs 1, max_tokens 1; every choice holds its prompt's tokens + 1
    scored = _complete(url, prompt=PROMPTS, max_tokens=1, temperature=0, logprobs=1, echo=True)["choices"]
    assert [len(c["logprobs"]["token_logprobs"]) for c in scored] == [len(p) + 1 for p in PROMPTS]
    single = _complete(url, prompt=PROMPTS[1], max_tokens=1, temperature=0, logprobs=1, echo=True)["choices"][0]
    assert scored[1]["logprobs"]["token_logprobs"][1:] == pytest.approx(single["logprobs"]["token_logprobs"][1:])


def test_a_batch_streams_with_choice_indices(url):
    one = [_complete(url, prompt=p, max_tokens=6, temperature=0)["choices"][0]["text"] for p in PROMPTS]
    body = {"model": "tiny", "prompt": PROMPTS, "max_tokens": 6, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    texts, finish, usage = ["", "", ""], [None] * 3, None
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"authorization": "Bearer k"}, timeout=300
    ) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev["choices"]:
                texts[c["index"]] += c["text"]
                finish[c["index"]] = c["finish_reason"] or finish[c["index"]]
    assert texts == one and finish == ["length"] * 3
    assert usage["completion_tokens"] == 18


@pytest.mark.parametrize(
    "prompt, why",
    [([], "non-empty"), ([[1, 2], "x", 3], "must be a string"), ([[-1]], ">= 0"), ([[1]] * 257, "at most 256")],
)
def test_bad_batches_are_400(url, prompt, why):
    r = _post(url, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1})
    assert r.status_code == 400 and why in r.json()["error"]["message"], r.text


def test_usage_counts_no_token_past_a_stop_string(url):
    """A decode chain of 8 delivers tokens past a stop string; they are neither returned nor counted."""
    for p in prompts(seed=11, lens=(12,) * 12):
        full = _complete(url, prompt=p, max_tokens=16, temperature=0)["choices"][0]["text"]
        # a stop string that ends inside the first chain (the prefill's token, then tokens 1-8)
        k = next(
            (k for k in range(3, 8) if full[k - 1 : k + 1].isascii() and full.find(full[k - 1 : k + 1]) == k - 1), None
        )
        if k is not None and len(full) == 16:
            break
    else:
        pytest.skip("no prompt whose greedy text has an ASCII stop string early on")
    got = _complete(url, prompt=p, max_tokens=16, temperature=0, stop=[full[k - 1 : k + 1]])
    assert got["choices"][0]["text"] == full[: k - 1] and got["choices"][0]["finish_reason"] == "stop"
    assert got["usage"]["completion_tokens"] == k + 1  # tokens 0..k: the k-th completed the stop string


def test_tokenize_detokenize_and_tokenizer_info(url):
    r = _post(url, "/tokenize", {"prompt": "héllo", "add_special_tokens": False, "return_token_strs": True})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "count": 6,
        "max_model_len": 320,
        "tokens": list("héllo".encode()),
        "token_strs": ["h", "bytes:\\xc3", "bytes:\\xa9", "l", "l", "o"],
    }
    chat = _post(url, "/tokenize", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == list(b"<|user|>\nhi\n<|assistant|>\n")
    assert _post(url, "/detokenize", {"tokens": list("héllo".encode())}).json() == {"prompt": "héllo"}
    info = httpx.get(f"{url}/tokenizer_info", headers={"authorization": "Bearer k"}).json()
    assert info["tokenizer_class"] == "ByteTokenizer" and info["model_max_length"] == 320
    assert info["eos_token"] is None and "bytes" in info["source"]
    assert _post(url, "/tokenize", {"prompt": "x"}, key=None).status_code == 401  # --api-key guards them too
    assert _post(url, "/tokenize", {"model": "other", "prompt": "x"}).status_code == 404
    assert _post(url, "/tokenize", {"prompt": "x", "messages": []}).status_code == 400
    assert _post(url, "/detokenize", {"tokens": [256]}).status_code == 400
