"""The real server (tiny dummy model on the CPU, in a subprocess) driven by the official `openai` client and httpx."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx
from server_proc import TINY, ServerProcess

MODEL = "tiny"
CONTEXT = 1024  # --max-context: small enough that overflow is cheap to provoke, long enough that a
# max-length request outlives any disconnect test (about 8 ms a token on the CPU)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(*TINY, "--max-context", str(CONTEXT), "--dtype", "float32")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=30)


def _post(server, path, body, timeout=30):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(
        f"{server.base_url}{path}", content=data, headers={"content-type": "application/json"}, timeout=timeout
    )


# ---- happy paths with the official client ----


def test_models_health_and_tokenizer(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    card = models[0].model_dump()
    assert card["dummy"] is True and card["max_model_len"] == CONTEXT and card["tokenizer"].startswith("byte-level")
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}


def test_completion_greedy_is_deterministic_and_stream_matches(client):
    a = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=7, temperature=0)
    b = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=7, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.choices[0].finish_reason == "length"
    assert (a.usage.prompt_tokens, a.usage.completion_tokens) == (19, 7)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="The quick brown fox",
            max_tokens=7,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == a.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 7


def test_token_id_prompt_and_sampling(client):
    r = client.completions.create(model=MODEL, prompt=[72, 105, 33], max_tokens=4, temperature=0.8, seed=3)
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 4


def test_seed_and_top_p_are_honoured(client):
    def text(**kw):
        return client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8, **kw).choices[0].text

    greedy = text(temperature=0)
    seeded = text(temperature=1.5, seed=11)
    assert text(temperature=1.5, seed=11) == seeded  # the same seed, the same tokens
    assert seeded != greedy
    assert text(temperature=1.5, top_p=1e-6, seed=11) == greedy  # a vanishing nucleus keeps only the argmax


def test_chat_completion_stream_and_not(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_string_truncates_and_finishes_with_stop(server, client):
    stops_before = server.metrics().get('oasis_requests_total{outcome="stop"}', 0.0)
    full = client.completions.create(model=MODEL, prompt="abc", max_tokens=12, temperature=0).choices[0].text
    stop = next((full[i : i + 2] for i in range(2, len(full) - 1) if "\ufffd" not in full[i : i + 2]), None)
    if stop is None:
        pytest.skip(f"greedy output {full!r} has no clean two-character substring")
    r = client.completions.create(model=MODEL, prompt="abc", max_tokens=12, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    s = client.completions.create(model=MODEL, prompt="abc", max_tokens=12, temperature=0, stop=stop, stream=True)
    chunks = list(s)
    assert "".join(c.choices[0].text for c in chunks) == full[: full.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    _wait_metric(server, 'oasis_requests_total{outcome="stop"}', stops_before + 2)  # ended as stops, not aborts
    server.wait_idle()


# ---- bad input ----


BAD = [
    ("malformed json", "/v1/completions", '{"model": "tiny", "prompt": ', None),
    ("body not an object", "/v1/completions", "[1, 2]", None),
    ("missing prompt", "/v1/completions", {"model": MODEL}, "prompt"),
    ("missing model", "/v1/completions", {"prompt": "x"}, "model"),
    ("max_tokens as string", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "4"}, "max_tokens"),
    ("max_tokens zero", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("max_tokens negative", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -3}, "max_tokens"),
    ("temperature typed", "/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "0"}, "temperature"),
    ("stream typed", "/v1/completions", {"model": MODEL, "prompt": "x", "stream": "true"}, "stream"),
    ("stop typed", "/v1/completions", {"model": MODEL, "prompt": "x", "stop": [1]}, "stop"),
    ("prompt typed", "/v1/completions", {"model": MODEL, "prompt": {"text": "x"}}, "prompt"),
    ("empty prompt", "/v1/completions", {"model": MODEL, "prompt": ""}, "prompt"),
    ("token id past vocab", "/v1/completions", {"model": MODEL, "prompt": [1, 999999]}, "prompt"),
    ("n > 1", "/v1/completions", {"model": MODEL, "prompt": "x", "n": 3}, "n"),
    ("top_p zero", "/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, "top_p"),
    ("top_p above one", "/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 1.5}, "top_p"),
    (
        "prompt + max_tokens > context",
        "/v1/completions",
        {"model": MODEL, "prompt": [65] * (CONTEXT - 10), "max_tokens": 11},
        "max_tokens",
    ),
    ("prompt alone fills context", "/v1/completions", {"model": MODEL, "prompt": [65] * CONTEXT}, "prompt"),
    ("chat messages missing", "/v1/chat/completions", {"model": MODEL}, "messages"),
    (
        "chat role invalid",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
        "messages[0].role",
    ),
    (
        "chat content typed",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": 42}]},
        "messages[0].content",
    ),
    (
        "chat too long",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x" * CONTEXT}], "max_tokens": 1},
        "prompt",
    ),
]


@pytest.mark.parametrize("name, path, body, param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_400_naming_the_field(server, name, path, body, param):
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param
    if param:
        assert param.split("[")[0] in err["message"]


def test_openai_client_sees_bad_request_with_param(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x" * (CONTEXT - 4), max_tokens=8)
    assert e.value.param == "max_tokens" and e.value.code == "context_length_exceeded"


def test_unknown_model_is_404(server, client):
    r = _post(server, "/v1/completions", {"model": "gpt-17", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-17", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/v1/completions"), ("PUT", "/v1/chat/completions"), ("POST", "/v1/models"), ("DELETE", "/health")],
)
def test_wrong_method_is_405(server, method, path):
    r = httpx.request(method, f"{server.base_url}{path}", timeout=10)
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed" and "allow" in r.headers


def test_unknown_route_is_404(server):
    r = httpx.get(f"{server.base_url}/v1/engines", timeout=10)
    assert r.status_code == 404 and "error" in r.json()


# ---- disconnects free what the request held ----


def _wait_metric(server, name, value, timeout_s=10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (m := server.metrics()).get(name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}: {m.get(name)}"
        time.sleep(0.02)
    return m


def _aborts(server) -> float:
    return server.metrics().get('oasis_requests_total{outcome="abort"}', 0.0)


def test_stream_disconnect_aborts_and_frees(server):
    before = _aborts(server)
    body = {"model": MODEL, "prompt": "hello", "max_tokens": CONTEXT - 8, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(3)]
        assert got[0].startswith("data: ")
        m = _wait_metric(server, "oasis_num_requests_running", 1)  # /metrics lags the engine by <= 50 ms
        # a short request holds no host blocks until it outgrows the resident window (oasis_core.short_context)
        assert m["oasis_gpu_slots_used"] > 0
    m = server.wait_idle()
    assert _aborts(server) == before + 1
    assert m["oasis_host_blocks_used"] == 0 and m["oasis_gpu_slots_used"] == 0


def test_non_stream_disconnect_aborts_and_frees(server):
    before = _aborts(server)
    body = {"model": MODEL, "prompt": "hello", "max_tokens": CONTEXT - 8}
    with pytest.raises(httpx.ReadTimeout):
        _post(server, "/v1/completions", body, timeout=httpx.Timeout(30, read=0.5))
    _wait_metric(server, 'oasis_requests_total{outcome="abort"}', before + 1)
    server.wait_idle()


# ---- overload ----


@pytest.fixture(scope="module")
def one_lane_server():
    srv = ServerProcess(
        *TINY, "--max-context", str(CONTEXT), "--dtype", "float32", "--max-lanes", "1", "--max-waiting", "1"
    )
    yield srv
    srv.stop()


def test_queue_full_is_429_with_retry_after(one_lane_server):
    srv = one_lane_server
    long = {"model": MODEL, "prompt": "a", "max_tokens": CONTEXT - 8, "stream": True}
    with httpx.Client(base_url=srv.base_url, timeout=30) as c:
        with c.stream("POST", "/v1/completions", json=long) as running:  # takes the only lane
            assert running.status_code == 200
            lines = running.iter_lines()  # keep a reference: a collected iterator closes the response
            next(lines)
            with c.stream("POST", "/v1/completions", json=long) as waiting:  # waits for it
                assert waiting.status_code == 200
                t0 = time.monotonic()
                r = c.post("/v1/completions", json={"model": MODEL, "prompt": "b", "max_tokens": 2})
                assert time.monotonic() - t0 < 5
                assert r.status_code == 429, r.text
                assert srv.metrics()["oasis_num_requests_waiting"] == 1
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "rate_limit_exceeded"
    srv.wait_idle()
    ok = httpx.post(f"{srv.base_url}/v1/completions", json={"model": MODEL, "prompt": "b", "max_tokens": 2})
    assert ok.status_code == 200


# ---- logprobs and echo ----


def _token_id(text: str) -> int:
    """The tiny model's vocabulary is the 256 bytes: a token's text is its byte (`bytes:\\xNN` when not UTF-8)."""
    return int(text[len("bytes:\\x") :], 16) if text.startswith("bytes:") else ord(text)


def test_completion_logprobs_are_the_models_and_greedy_picks_the_top(server):
    r = _post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": "Hello there", "max_tokens": 6, "temperature": 0, "logprobs": 3},
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
    for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert chosen <= 0 and 1 <= len(top) <= 3
        assert chosen == pytest.approx(max(top.values()), abs=1e-6)  # greedy: the chosen token is the most likely
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    stream = list(
        _sse(
            server,
            {"model": MODEL, "prompt": "Hello there", "max_tokens": 6, "temperature": 0, "logprobs": 3, "stream": True},
        )
    )
    streamed = [
        x
        for c in stream
        if c["choices"] and c["choices"][0]["logprobs"]
        for x in c["choices"][0]["logprobs"]["token_logprobs"]
    ]
    assert streamed == pytest.approx(lp["token_logprobs"], abs=1e-6)


def test_echo_scores_the_prompt_as_decoding_scored_the_completion(server):
    prompt = [72, 101, 108, 108, 111, 44, 32, 119]
    a = _post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 2, "echo": True},
    ).json()["choices"][0]
    lp = a["logprobs"]
    assert len(lp["tokens"]) == len(prompt) + 4
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert a["text"].startswith("Hello, w") and lp["text_offset"][len(prompt)] == len("Hello, w")
    generated = [_token_id(t) for t in lp["tokens"][len(prompt) :]]
    # the same tokens, now all in the prompt: the dense forward over the prompt must give what decoding gave
    b = _post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": prompt + generated, "max_tokens": 0, "logprobs": 2, "echo": True},
    )
    assert b.status_code == 200, b.text
    blp = b.json()["choices"][0]["logprobs"]
    assert b.json()["usage"] == {
        "prompt_tokens": len(prompt) + 4,
        "completion_tokens": 0,
        "total_tokens": len(prompt) + 4,
    }
    assert blp["token_logprobs"][1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-3)
    plain = _post(
        server, "/v1/completions", {"model": MODEL, "prompt": "abc", "max_tokens": 2, "echo": True, "temperature": 0}
    ).json()["choices"][0]
    assert plain["text"].startswith("abc") and plain["logprobs"] is None


def test_chat_logprobs_and_default_max_tokens_fill_the_context(server):
    msgs = [{"role": "user", "content": "Hi"}]
    r = _post(
        server,
        "/v1/chat/completions",
        {"model": MODEL, "messages": msgs, "max_tokens": 5, "temperature": 0, "logprobs": True, "top_logprobs": 2},
    ).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"] == 5
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-6)
        assert len(entry["bytes"]) == 1  # one byte a token in the tiny vocabulary
    r = _post(
        server, "/v1/chat/completions", {"model": MODEL, "messages": msgs, "temperature": 0, "max_tokens": None}
    ).json()  # null: the default
    assert r["usage"]["total_tokens"] == CONTEXT and r["choices"][0]["finish_reason"] == "length"


def test_unimplemented_parameter_is_400_naming_it(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, frequency_penalty=0.5)
    assert e.value.param == "frequency_penalty"
    r = _post(
        server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2,
            "tools": [{"type": "function"}],
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    ok = client.completions.create(model=MODEL, prompt="x", max_tokens=2, frequency_penalty=0, presence_penalty=0)
    assert ok.usage.completion_tokens == 2


def _sse(server, body):
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[len("data: ") :])
