"""Fakes for in-process server tests: a trivial engine implementing the server's `ServingEngine` protocol (for
failure injection), a tokenizer that blocks on demand, and `serve_app` (uvicorn in a thread).

The fake engine is not the executor: the end-to-end server tests run the real engine. It exists to make an engine
step fail or hang on demand, which the real engine cannot be asked to do.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time

from oasis_exec.server.engine_protocol import EngineStats, ModelInfo, Sampling, StepOutput
from oasis_exec.server.tokenizer import ByteTokenizer


class FakeEngine:
    SLOTS_PER_REQUEST = 4

    def __init__(
        self,
        *,
        max_running: int = 8,
        max_model_len: int = 256,
        step_s: float = 0.002,
        fail_at_step: int | None = None,
        fail_steps: tuple[int, ...] = (),
        checkable: bool = False,
    ) -> None:
        self.model_info = ModelInfo(
            name="fake", max_model_len=max_model_len, vocab_size=256, dummy=True, mode="dense", device="cpu"
        )
        self.max_running = max_running
        self.step_s = step_s
        self.fail_at_step = fail_at_step  # this step and every later one raise
        self.fail_steps = set(fail_steps)  # only these steps raise
        self.broken = False  # check() raises while set
        self.gate: threading.Event | None = None  # when set to an Event, step() waits for it (a hung engine)
        self.entered = threading.Event()  # set when a step begins (a test knows the step is in progress)
        if checkable:
            self.check = self._check
        self._ids = itertools.count()
        self._waiting: list[int] = []
        self._running: dict[int, list] = {}
        self._req: dict[int, tuple[list[int], Sampling]] = {}
        self.n_steps = 0

    def add_request(self, prompt_ids, sampling: Sampling):
        if len(prompt_ids) + sampling.max_tokens > self.model_info.max_model_len:
            raise ValueError("too long")
        rid = next(self._ids)
        self._req[rid] = (list(prompt_ids), sampling)
        self._waiting.append(rid)
        return rid

    def abort(self, rid) -> None:
        self._req.pop(rid, None)
        self._running.pop(rid, None)
        if rid in self._waiting:
            self._waiting.remove(rid)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def step(self) -> list[StepOutput]:
        self.n_steps += 1
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        if (self.fail_at_step is not None and self.n_steps >= self.fail_at_step) or self.n_steps in self.fail_steps:
            raise RuntimeError("injected failure")
        while self._waiting and len(self._running) < self.max_running:
            self._running[self._waiting.pop(0)] = []
        time.sleep(self.step_s)
        outs = []
        for rid, toks in list(self._running.items()):
            prompt, sampling = self._req[rid]
            tok = 97 + (sum(prompt) + len(toks)) % 26  # 'a'..'z'
            toks.append(tok)
            done = len(toks) >= sampling.max_tokens
            outs.append(StepOutput(rid, (tok,), "length" if done else None))
            if done:
                self.abort(rid)
        return outs

    def _check(self) -> None:
        if self.broken:
            raise RuntimeError("still broken")

    def stats(self) -> EngineStats:
        used = len(self._running) * self.SLOTS_PER_REQUEST
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            gpu_slots_used=used,
            gpu_slots_total=self.max_running * self.SLOTS_PER_REQUEST,
            host_blocks_used=used,
            host_blocks_total=1024,
        )


class BlockingTokenizer(ByteTokenizer):
    """The byte tokenizer, except that `encode` waits until `release` is set (and says when it has started)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.started.set()
        if not self.release.wait(30):
            raise RuntimeError("BlockingTokenizer: never released")
        return super().encode(text, add_special_tokens)


@contextlib.contextmanager
def serve_app(app):
    """Run an ASGI app with uvicorn in a thread of this process, on a free port; yield its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the in-process server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
