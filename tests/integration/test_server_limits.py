"""Request bodies: the size limit (413) and no parsing or tokenising on the event loop (in-process server, fake
engine)."""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("fastapi")
import httpx
from server_fakes import BlockingTokenizer, FakeEngine, serve_app

from oasis_exec.server.app import create_app
from oasis_exec.server.config import ServerConfig
from oasis_exec.server.tokenizer import ByteTokenizer

JSON = {"content-type": "application/json"}


def _app(tokenizer=None, **config):
    return create_app(
        FakeEngine(step_s=0, max_model_len=2_000_000), tokenizer or ByteTokenizer(), ServerConfig(**config)
    )


def test_body_over_the_limit_is_413_declared_or_streamed():
    body = json.dumps({"model": "fake", "prompt": "x" * 2000, "max_tokens": 1}).encode()
    with serve_app(_app(max_body_bytes=1000)) as url:
        r = httpx.post(f"{url}/v1/completions", content=body, headers=JSON)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "request_too_large" and "1000" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: the limit must hold while reading
            for i in range(0, len(body), 100):
                yield body[i : i + 100]

        r = httpx.post(f"{url}/v1/chat/completions", content=chunks(), headers=JSON)
        assert r.status_code == 413, r.text
        small = {"model": "fake", "prompt": "hi", "max_tokens": 2}
        assert httpx.post(f"{url}/v1/completions", json=small).status_code == 200  # under the limit: served


def test_health_metrics_and_streams_answer_while_a_body_is_tokenised():
    tok = BlockingTokenizer()
    with serve_app(_app(tok)) as url:
        big = {"model": "fake", "prompt": "y" * 1_000_000, "max_tokens": 1}
        result = {}

        def send():
            result["r"] = httpx.post(f"{url}/v1/completions", json=big, timeout=60)

        sender = threading.Thread(target=send)
        sender.start()
        try:
            assert tok.started.wait(30), "the request never reached the tokenizer"
            # encode() is blocked right now; were it on the event loop, nothing below could be answered
            assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}
            assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
            ids = {"model": "fake", "prompt": [1, 2, 3], "max_tokens": 3, "stream": True}  # token ids: no encode
            with httpx.stream("POST", f"{url}/v1/completions", json=ids, timeout=10) as r:
                lines = [line for line in r.iter_lines() if line]
            assert lines[-1] == "data: [DONE]" and len(lines) == 4
            assert not result, "the blocked request finished early"
        finally:
            tok.release.set()
            sender.join(60)
        assert result["r"].status_code == 200, result["r"].text
        assert result["r"].json()["usage"]["prompt_tokens"] == 1_000_000
