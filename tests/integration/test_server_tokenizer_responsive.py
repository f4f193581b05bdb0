"""Issue 35, class 7: the real tokenizer never freezes the event loop. A multi-MB prompt tokenised by SmolLM2's
own tokenizer (``tokenizers``, whose ``encode`` holds the interpreter lock for the whole call: 5-29 s of frozen
``/health`` at 7e01859) leaves ``/health`` answering within a second throughout, and yields exactly the tokens of
``encode``; a prompt that cannot fit the context is refused before it is tokenised."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("tokenizers")
import httpx
from server_fakes import FakeEngine, serve_app

from oasis_exec.server.app import create_app
from oasis_exec.server.config import ServerConfig

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def tokenizer():
    from oasis_exec.model.gguf import smollm2_path
    from oasis_exec.server.tokenizer import load_tokenizer

    try:
        path = smollm2_path()
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"the SmolLM2 GGUF is not installed: {e}")
    return load_tokenizer(path)


def _app(tokenizer, max_model_len):
    return create_app(
        FakeEngine(step_s=0, max_model_len=max_model_len), tokenizer, ServerConfig(max_body_bytes=64 << 20)
    )


def _health_gaps(url, stop: threading.Event, out: list) -> None:
    """Seconds between successive /health answers (a request every 20 ms): the server and this client share a
    process, so a call that holds the interpreter lock shows here whether it stalls the request or the wait."""
    with httpx.Client(timeout=60) as c:
        last = time.monotonic()
        while not stop.is_set():
            assert c.get(f"{url}/health").status_code == 200
            now = time.monotonic()
            out.append(now - last)
            last = now
            time.sleep(0.02)


def test_health_answers_while_a_multi_mb_prompt_is_tokenised(tokenizer):
    text = "The quick brown fox jumps over the lazy dog; 12345 naïve café. " * 40_000  # 2.6 MB
    expected = len(tokenizer._tok.encode(text, add_special_tokens=True).ids)
    with serve_app(_app(tokenizer, max_model_len=4_000_000)) as url:
        lat: list[float] = []
        stop = threading.Event()
        poller = threading.Thread(target=_health_gaps, args=(url, stop, lat))
        poller.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        r = httpx.post(
            f"{url}/v1/completions",
            json={"model": "fake", "prompt": text, "max_tokens": 1},
            headers=JSON,
            timeout=300,
        )
        took = time.monotonic() - t0
        stop.set()
        poller.join(60)
    assert r.status_code == 200, r.text[:500]
    assert r.json()["usage"]["prompt_tokens"] == expected  # the same tokens as the tokenizer's own encode
    during = lat[2:]  # /health answers while the prompt was read and tokenised
    assert len(during) >= 5, (lat, took)
    assert max(during) < 1.0, f"/health went unanswered for {max(during):.2f} s while tokenising ({took:.1f} s)"


def test_a_prompt_that_cannot_fit_is_refused_before_tokenising(tokenizer):
    text = "word " * 400_000  # 2 MB: at least 2e6 / chars_per_token tokens, far beyond 8,192
    calls = []
    real = tokenizer.encode
    tokenizer.encode = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        with serve_app(_app(tokenizer, max_model_len=8192)) as url:
            t0 = time.monotonic()
            r = httpx.post(f"{url}/v1/completions", json={"model": "fake", "prompt": text, "max_tokens": 1}, timeout=60)
            took = time.monotonic() - t0
    finally:
        del tokenizer.encode
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
    assert "more than the model's context of 8192" in r.json()["error"]["message"]
    assert not calls and took < 5
