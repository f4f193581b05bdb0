"""`ServerContext`: what every route shares, built once per app from the config, the engine and the tokenizer.

It holds the engine loop and the metrics, and offers the routes the few things they all do: read and parse a
request body, check the model name, submit a request to the engine (its refusals as OpenAI errors), score a prompt,
and run a request to its end while watching for the client going away. A route finds it with `context_of(request)`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable

from fastapi import Request
from pydantic import BaseModel, ValidationError

from .config import ServerConfig
from .engine_loop import EngineLoop, QueueFull, Rejected, RequestStream
from .engine_protocol import ModelInfo, Sampling, ServingEngine
from .errors import APIError, from_validation_error
from .generation import Outcome, Piece, no_output, text_pieces
from .metrics import ServerMetrics
from .tokenizer import Tokenizer

RETRY_AFTER_S = 1

log = logging.getLogger("oasis_exec.server")


@dataclass(frozen=True)
class ServerContext:
    config: ServerConfig
    engine: ServingEngine
    tokenizer: Tokenizer
    info: ModelInfo  # read once, at build
    model_name: str  # the name clients must send: `--served-model-name`, else the model's
    loop: EngineLoop
    metrics: ServerMetrics
    served: Any = None  # a `record.ServeLog` (`serve --record`), written once the engine thread has stopped

    @classmethod
    def build(
        cls, engine: ServingEngine, tokenizer: Tokenizer, config: ServerConfig, served=None, clock=time.monotonic
    ) -> "ServerContext":
        """`clock`: the seconds /health's stall rule reads (tests drive it)."""
        metrics = ServerMetrics(lambda: loop.snapshot())  # read at scrape time, after `loop` exists
        loop = EngineLoop(
            engine,
            max_waiting=config.max_waiting,
            metrics=metrics,
            served=served,
            stall_timeout_s=config.stall_timeout_s,
            clock=clock,
        )
        info = engine.model_info
        return cls(config, engine, tokenizer, info, config.served_model_name or info.name, loop, metrics, served)

    # ---- the request ----

    async def read_body(self, request: Request) -> bytes:
        """The body, read chunk by chunk; 413 as soon as it exceeds the limit (or declares that it will)."""
        limit = self.config.max_body_bytes
        too_large = APIError(
            413, f"request body exceeds the limit of {limit} bytes (--max-body-bytes)", code="request_too_large"
        )
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(
                404,
                f"the model '{name}' does not exist; this server serves '{self.model_name}'",
                param="model",
                code="model_not_found",
            )

    # ---- the engine ----

    async def submit(self, ids: list[int], sampling: Sampling, stops: bool = False) -> RequestStream:
        try:
            stream = await self.loop.submit(ids, sampling, stops)
        except QueueFull as exc:
            self.metrics.rejected.labels("queue_full").inc()
            raise APIError(
                429,
                f"server overloaded: {exc}; retry later",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        except Rejected as exc:
            self.metrics.rejected.labels("engine").inc()
            param = _leading_field(exc.message) if exc.status == 400 else None
            raise APIError(exc.status, exc.message, param=param, code=exc.code) from None
        self.metrics.prompt_tokens.inc(len(ids))
        return stream

    async def start(
        self, ids: list[int], sampling: Sampling | None, stops: list[str], outcome: Outcome
    ) -> tuple[RequestStream | None, AsyncIterator[Piece]]:
        """Submit; the pieces of its output (for `max_tokens` 0: nothing, ended by "length")."""
        if sampling is None:
            return None, no_output(outcome)
        stream = await self.submit(ids, sampling, bool(stops))
        return stream, text_pieces(stream, self.tokenizer.detokenizer(), stops, self.loop.abort, outcome)

    async def score_prompt(self, ids: list[int], top_n: int) -> list:
        """Each prompt token's logprobs given the tokens before it (the engine's dense forward)."""
        engine = self.engine
        if not callable(getattr(engine, "prompt_logprobs", None)):
            raise APIError(
                400,
                "echo: this engine cannot score a prompt; send echo without logprobs",
                param="echo",
                code="unsupported_parameter",
            )
        try:
            return await self.loop.call(lambda: engine.prompt_logprobs(ids, top_n))
        except Rejected as exc:
            raise APIError(exc.status, exc.message, code=exc.code) from None
        except Exception as exc:
            log.exception("scoring the prompt failed")
            raise APIError(
                500, f"scoring the prompt failed: {type(exc).__name__}: {exc}", code="engine_error"
            ) from None

    async def collect(
        self, request: Request, stream: RequestStream | None, pieces: AsyncIterator[Piece]
    ) -> list[Piece]:
        """Run a request to its end while watching for the client going away."""
        if stream is None:
            return [p async for p in pieces]

        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    self.loop.abort(stream)
                    return

        watcher = asyncio.create_task(watch())
        try:
            return [p async for p in pieces]
        finally:
            watcher.cancel()
            self.loop.abort(stream)

    def abort_all(self, streams: Iterable[RequestStream | None]) -> None:
        """End these requests (a no-op for those that have finished; None: no request ran)."""
        for stream in streams:
            if stream is not None:
                self.loop.abort(stream)


def context_of(request: Request) -> ServerContext:
    return request.app.state.context


def parse(body: bytes, model: type[BaseModel]) -> Any:
    """The body as `model`, or a 400 naming the first field it refuses."""
    try:
        return model.model_validate_json(body or b"")
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def ended_in_error(outcome: Outcome) -> APIError:
    """The error a request that ended in error answers with (503 when the server was shutting down)."""
    status = 503 if outcome.error_code == "server_shutting_down" else 500
    return APIError(status, outcome.error or "the request ended without output", code=outcome.error_code)


def _leading_field(message: str) -> str | None:
    """'top_p: not supported' -> 'top_p'; the engine names the field it refuses that way, when it can."""
    head, sep, _ = message.partition(":")
    return head if sep and head.isidentifier() else None
