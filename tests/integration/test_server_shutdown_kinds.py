"""Issue 35, class 8: shutdown ends every request kind in flight with the documented 503 `server_shutting_down`,
prompt scoring (`echo` + `logprobs`) included (7e01859 did not track it: uvicorn's cut-off gave a plain-text
500). In-process: the engine's `prompt_logprobs` blocks until the test releases it, the server is told to stop."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
import httpx
import uvicorn
from server_fakes import FakeEngine

from oasis_exec.server.app import create_app
from oasis_exec.server.config import ServerConfig
from oasis_exec.server.engine_protocol import TokenLogprobs
from oasis_exec.server.lifecycle import GracefulServer
from oasis_exec.server.tokenizer import ByteTokenizer


class ScoringEngine(FakeEngine):
    """Scores a prompt only once `release` is set; `scoring` says a scoring call has begun."""

    def __init__(self) -> None:
        super().__init__(step_s=0)
        self.scoring = threading.Event()
        self.release = threading.Event()

    def prompt_logprobs(self, ids, top_n):
        self.scoring.set()
        self.release.wait(30)
        return [None] + [TokenLogprobs(-1.0, ((int(t), -1.0),)) for t in ids[1:]]


def _run(app, grace_s):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = GracefulServer(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5),
        engine_loop=app.state.engine_loop,
        grace_s=grace_s,
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("max_tokens", [0, 4], ids=["score-only", "score-then-generate"])
def test_prompt_scoring_in_flight_at_shutdown_gets_the_documented_503(max_tokens):
    engine = ScoringEngine()
    app = create_app(engine, ByteTokenizer(), ServerConfig())
    server, thread, url = _run(app, grace_s=0.3)
    got: dict = {}
    body = {"model": "fake", "prompt": "abcd", "max_tokens": max_tokens, "echo": True, "logprobs": 1}
    client = threading.Thread(
        target=lambda: got.setdefault("r", httpx.post(f"{url}/v1/completions", json=body, timeout=60))
    )
    client.start()
    try:
        assert engine.scoring.wait(20), "the scoring call never began"
        t0 = time.monotonic()
        server.should_exit = True  # what SIGTERM / SIGINT do
        client.join(30)
        took = time.monotonic() - t0
    finally:
        engine.release.set()
        thread.join(30)
    r = got["r"]
    assert r.status_code == 503, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["code"] == "server_shutting_down" and "grace period" in err["message"], err
    assert took < 5, f"answered {took:.1f} s after the shutdown began (grace 0.3 s)"


def test_scoring_that_ends_within_the_grace_period_completes():
    engine = ScoringEngine()
    app = create_app(engine, ByteTokenizer(), ServerConfig())
    server, thread, url = _run(app, grace_s=20)
    got: dict = {}
    body = {"model": "fake", "prompt": "abcd", "max_tokens": 0, "echo": True, "logprobs": 1}
    client = threading.Thread(
        target=lambda: got.setdefault("r", httpx.post(f"{url}/v1/completions", json=body, timeout=60))
    )
    client.start()
    assert engine.scoring.wait(20)
    server.should_exit = True
    time.sleep(0.5)
    engine.release.set()
    client.join(30)
    thread.join(30)
    assert got["r"].status_code == 200, got["r"].text[:300]
    assert got["r"].json()["choices"][0]["logprobs"]["tokens"] == list("abcd")
