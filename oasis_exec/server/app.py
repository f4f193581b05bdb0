"""The FastAPI application: OpenAI-compatible completions and chat completions over an `EngineLoop`.

`create_app(engine, tokenizer, ...)` builds the app; the engine thread starts and stops with the app's lifespan.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import schemas as S
from . import scoring, security, tokenize_api
from .config import ServerConfig
from .engine_loop import EngineLoop, QueueFull, Rejected, RequestStream
from .engine_protocol import Sampling, ServingEngine
from .errors import APIError, error_body, error_response, from_validation_error
from .generation import Outcome, Piece, merged_events, text_pieces
from .logprobs import CompletionLogprobs, chat_entries
from .metrics import CONTENT_TYPE, ServerMetrics
from .tokenizer import Tokenizer

RETRY_AFTER_S = 1

log = logging.getLogger("oasis_exec.server")


def _leading_field(message: str) -> str | None:
    """'top_p: not supported' -> 'top_p'; the engine names the field it refuses that way, when it can."""
    head, sep, _ = message.partition(":")
    return head if sep and head.isidentifier() else None


def _merged(parts: list[dict]) -> dict:
    return {k: [v for p in parts for v in p[k]] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def create_app(
    engine: ServingEngine, tokenizer: Tokenizer, config: ServerConfig, served=None, clock=time.monotonic
) -> FastAPI:
    """`served`: a `record.ServeLog` (`serve --record`), written once the engine thread has stopped; `clock`: the
    seconds /health's stall rule reads (tests drive it).

    Request bodies are read incrementally up to `config.max_body_bytes` (413 beyond); parsing, validation and
    tokenisation run in a worker thread, so a large body never blocks the event loop (streams, /health)."""
    info = engine.model_info
    model_name = config.served_model_name or info.name
    metrics = ServerMetrics(lambda: loop.snapshot())  # read at scrape time, after `loop` exists
    loop = EngineLoop(
        engine,
        max_waiting=config.max_waiting,
        metrics=metrics,
        served=served,
        stall_timeout_s=config.stall_timeout_s,
        clock=clock,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop.start()
        try:
            yield
        finally:
            await loop.stop()
            if served is not None:
                served.write()

    app = FastAPI(title="OasisKV", lifespan=lifespan)
    app.state.engine_loop = loop
    app.state.metrics = metrics
    security.install(app, config)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = str(exc.detail)
        if exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        elif exc.status_code == 404:
            message = f"no route {request.url.path}"
        return JSONResponse(
            error_body(exc.status_code, message, code=code), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        return error_response(APIError(400, str(exc.errors()[0].get("msg")), code="invalid_request"))

    # ---- helpers ----

    async def read_body(request: Request) -> bytes:
        """The body, read chunk by chunk; 413 as soon as it exceeds the limit (or declares that it will)."""
        limit = config.max_body_bytes
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

    def parse(body: bytes, model: type[BaseModel]) -> Any:
        try:
            return model.model_validate_json(body or b"")
        except ValidationError as exc:
            raise from_validation_error(exc) from None

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(
                404,
                f"the model '{name}' does not exist; this server serves '{model_name}'",
                param="model",
                code="model_not_found",
            )

    def prepare(
        prompt: str | list[int], req: S._SamplingFields, chat: bool = False
    ) -> tuple[list[int], Sampling | None]:
        """Token ids and sampling of a request; sampling is None for `max_tokens` 0 (an echo that only scores)."""
        if isinstance(prompt, str):  # a rendered chat template holds its own special tokens
            at_least = len(prompt) // getattr(tokenizer, "chars_per_token", len(prompt) + 1)
            if at_least > info.max_model_len:  # bounded work: refused before tokenising
                raise APIError(
                    400,
                    f"prompt: {len(prompt):,} characters are at least {at_least:,} tokens, more than the model's "
                    f"context of {info.max_model_len}",
                    param="prompt",
                    code="context_length_exceeded",
                )
            ids = tokenizer.encode(prompt, add_special_tokens=not chat)
        else:
            ids = list(prompt)
            bad = [t for t in ids if t >= info.vocab_size]
            if bad:
                raise APIError(
                    400,
                    f"prompt: token id {bad[0]} is outside the vocabulary (size {info.vocab_size})",
                    param="prompt",
                    code="invalid_value",
                )
        if not ids:
            raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
        if req.max_tokens == 0:
            if len(ids) > info.max_model_len:
                raise APIError(
                    400,
                    f"prompt: {len(ids)} tokens exceed the model's context of {info.max_model_len}",
                    param="prompt",
                    code="context_length_exceeded",
                )
            return ids, None
        if len(ids) >= info.max_model_len:
            raise APIError(
                400,
                f"prompt: {len(ids)} tokens leave no room in the model's context of {info.max_model_len}",
                param="prompt",
                code="context_length_exceeded",
            )
        max_tokens = req.max_tokens
        if max_tokens is None:
            max_tokens = info.max_model_len - len(ids) if chat else S.DEFAULT_MAX_TOKENS
        if len(ids) + max_tokens > info.max_model_len:
            raise APIError(
                400,
                f"max_tokens: the prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds the model's "
                f"context of {info.max_model_len} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        sampling = Sampling(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop_token_ids=tuple(tokenizer.eos_token_ids),
            seed=req.seed,
            logprobs=req.top_n(),
        )
        return ids, sampling

    async def submit(ids: list[int], sampling: Sampling) -> RequestStream:
        try:
            stream = await loop.submit(ids, sampling)
        except QueueFull as exc:
            metrics.rejected.labels("queue_full").inc()
            raise APIError(
                429,
                f"server overloaded: {exc}; retry later",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        except Rejected as exc:
            metrics.rejected.labels("engine").inc()
            raise APIError(
                exc.status, exc.message, param=_leading_field(exc.message) if exc.status == 400 else None, code=exc.code
            ) from None
        metrics.prompt_tokens.inc(len(ids))
        return stream

    async def score_prompt(ids: list[int], top_n: int) -> list:
        if not callable(getattr(engine, "prompt_logprobs", None)):
            raise APIError(
                400,
                "echo: this engine cannot score a prompt; send echo without logprobs",
                param="echo",
                code="unsupported_parameter",
            )
        try:
            return await loop.call(lambda: engine.prompt_logprobs(ids, top_n))
        except Rejected as exc:
            raise APIError(exc.status, exc.message, code=exc.code) from None
        except Exception as exc:
            log.exception("scoring the prompt failed")
            raise APIError(
                500, f"scoring the prompt failed: {type(exc).__name__}: {exc}", code="engine_error"
            ) from None

    async def collect(request: Request, stream: RequestStream | None, pieces: AsyncIterator[Piece]) -> list[Piece]:
        """Run a request to its end while watching for the client going away."""
        if stream is None:
            return [p async for p in pieces]

        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    loop.abort(stream)
                    return

        watcher = asyncio.create_task(watch())
        try:
            return [p async for p in pieces]
        finally:
            watcher.cancel()
            loop.abort(stream)

    def sse(stream: RequestStream | None, events: AsyncIterator[dict]) -> StreamingResponse:
        async def body():
            try:
                async for ev in events:
                    yield f"data: {json.dumps(ev, separators=(',', ':'))}\n\n"
            except Exception as exc:  # headers are sent: report in-band, as OpenAI does
                log.exception("streaming failed")
                err = error_body(500, f"{type(exc).__name__}: {exc}", code="server_error")
                yield f"data: {json.dumps(err)}\n\n"
            finally:
                if stream is not None:
                    loop.abort(stream)  # a no-op when the request has finished; frees it when the client left
            yield "data: [DONE]\n\n"

        return StreamingResponse(
            body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    def usage(prompt_len: int, outcome: Outcome) -> S.Usage:
        return S.Usage(
            prompt_tokens=prompt_len,
            completion_tokens=outcome.completion_tokens,
            total_tokens=prompt_len + outcome.completion_tokens,
        )

    def ended_in_error(outcome: Outcome) -> APIError:
        status = 503 if outcome.error_code == "server_shutting_down" else 500
        return APIError(status, outcome.error or "the request ended without output", code=outcome.error_code)

    def stream_error(outcome: Outcome) -> dict:
        return ended_in_error(outcome).body()

    async def start(
        ids: list[int], sampling: Sampling | None, stops: list[str], outcome: Outcome
    ) -> tuple[RequestStream | None, AsyncIterator[Piece]]:
        """Submit; the pieces of its output (for `max_tokens` 0: nothing, ended by "length")."""
        if sampling is None:

            async def nothing():
                outcome.finish_reason = "length"
                yield Piece("", "length")

            return None, nothing()
        stream = await submit(ids, sampling)
        return stream, text_pieces(stream, tokenizer.detokenizer(), stops, loop.abort, outcome)

    # ---- endpoints ----

    @app.get("/health")
    async def health():
        status, reason = loop.health()
        if status == "ok":
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": status, "reason": reason}, status_code=503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        card = S.ModelCard(
            id=model_name,
            created=S.now(),
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            tokenizer=tokenizer.describe(),
            dummy=info.dummy,
            mode=info.mode,
            device=info.device,
        )
        return S.ModelList(data=[card]).model_dump()

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read_body(request)

        def decode() -> tuple[S.CompletionRequest, list[tuple[list[int], Sampling | None]]]:  # a worker thread
            req = parse(body, S.CompletionRequest)
            check_model(req.model)
            return req, [prepare(p, req) for p in req.prompts()]

        req, prepared = await loop.prepare(decode)
        top_n = req.top_n()
        rid, created = S.new_id("cmpl"), S.now()
        runs = []
        try:
            for prompt, (ids, sampling) in zip(req.prompts(), prepared):
                runs.append(await start_completion(req, prompt, ids, sampling, top_n))
        except BaseException:
            for run in runs:
                if run.scored.stream is not None:
                    loop.abort(run.scored.stream)
            raise

        def chunk(index: int, text: str, finish: str | None, logprobs: dict | None = None) -> dict:
            return S.CompletionResponse(
                id=rid,
                created=created,
                model=req.model,
                choices=[S.CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=logprobs)],
            ).model_dump(exclude_none=False)

        def total_usage() -> S.Usage:
            prompt_tokens = sum(len(ids) for ids, _ in prepared)
            completion_tokens = sum(run.outcome.completion_tokens for run in runs)
            return S.Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            )

        if not req.stream:
            try:
                choices = await asyncio.gather(*(run.choice(request, i) for i, run in enumerate(runs)))
            except BaseException:  # one prompt failed: the others' requests end too
                for run in runs:
                    if run.scored.stream is not None:
                        loop.abort(run.scored.stream)
                raise
            return S.CompletionResponse(
                id=rid, created=created, model=req.model, choices=list(choices), usage=total_usage()
            ).model_dump()

        async def events():
            async for index, ev in merged_events([run.events() for run in runs]):
                if ev is None:
                    continue
                if "error" in ev:
                    yield ev
                    return
                yield chunk(index, *ev["chunk"])
            if req.stream_options and req.stream_options.include_usage:
                last = chunk(0, "", None)
                last["choices"] = []
                last["usage"] = total_usage().model_dump()
                yield last

        return sse_many([run.scored.stream for run in runs], events())

    async def start_completion(req, prompt, ids: list[int], sampling: Sampling | None, top_n: int | None):
        """One prompt of a completions request, started (a choice: `.choice()` runs it, `.events()` streams it)."""
        outcome = Outcome()
        echo = (prompt if isinstance(prompt, str) else tokenizer.decode(ids)) if req.echo else ""
        if req.echo and top_n is not None:
            scored = await scoring.start(
                ids=ids,
                sampling=sampling,
                req=req,
                top_n=top_n,
                outcome=outcome,
                tokenizer=tokenizer,
                engine=engine,
                attention=config.score_attention,
                prefill_tokens=config.score_prefill_tokens,
                submit=submit,
                score_prompt=score_prompt,
                call=loop.call,
                abort=loop.abort,
            )
        else:
            stream, pieces = await start(ids, sampling, req.stop, outcome)
            scored = scoring.Scored(stream, pieces, None)
        return _CompletionRun(scored, outcome, echo, ids, top_n)

    class _CompletionRun:
        def __init__(self, scored, outcome: Outcome, echo: str, ids: list[int], top_n: int | None) -> None:
            self.scored, self.outcome, self.echo, self.ids = scored, outcome, echo, ids
            self.lp = CompletionLogprobs(tokenizer) if top_n is not None else None
            if self.lp is not None:
                self.lp.skip_text(echo)  # the completion's offsets start after the echoed prompt

        def prompt_entries(self) -> dict | None:
            if self.lp is None or self.scored.prompt is None:
                return None
            return CompletionLogprobs(tokenizer).entries(self.ids, self.scored.prompt)

        async def choice(self, request: Request, index: int) -> S.CompletionChoice:
            got = await collect(request, self.scored.stream, self.scored.pieces)
            if self.outcome.finish_reason == "error":
                raise ended_in_error(self.outcome)
            logprobs = None
            if self.lp is not None:
                parts = [self.lp.entries(p.token_ids, p.logprobs) for p in got if p.logprobs is not None]
                head = self.prompt_entries()
                logprobs = _merged(([head] if head else []) + parts)
            text = self.echo + "".join(p.text for p in got)
            return S.CompletionChoice(
                index=index, text=text, finish_reason=self.outcome.finish_reason, logprobs=logprobs
            )

        async def events(self):
            """(text, finish, logprobs) chunks; {"error": ...} once on failure."""
            pieces = self.scored.pieces
            first = await anext(pieces, None)  # the prompt's scores are ready once the first piece is
            if self.echo:
                yield {"chunk": (self.echo, None, self.prompt_entries())}
            if first is not None:
                ev = self._event(first)
                yield ev
                if "error" in ev:
                    return
            async for p in pieces:
                ev = self._event(p)
                yield ev
                if "error" in ev:
                    return

        def _event(self, p: Piece) -> dict:
            if p.finish_reason == "error":
                return stream_error(self.outcome)
            lp = self.lp.entries(p.token_ids, p.logprobs) if self.lp is not None and p.logprobs is not None else None
            return {"chunk": (p.text, p.finish_reason, lp)}

    def sse_many(streams: list, events: AsyncIterator[dict]) -> StreamingResponse:
        async def abort_all():
            for s in streams:
                if s is not None:
                    loop.abort(s)

        async def guarded():
            try:
                async for ev in events:
                    yield ev
            finally:
                await abort_all()

        return sse(None, guarded())

    tokenize_api.install(
        app,
        tokenizer=tokenizer,
        max_model_len=info.max_model_len,
        vocab_size=info.vocab_size,
        read_body=read_body,
        parse=parse,
        check_model=check_model,
    )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_body(request)

        def decode() -> tuple[S.ChatCompletionRequest, list[int], Sampling]:  # a worker thread
            req = parse(body, S.ChatCompletionRequest)
            check_model(req.model)
            try:
                prompt = tokenizer.apply_chat_template([m.model_dump(exclude_none=True) for m in req.messages])
            except ValueError as exc:  # no template, or the template refused the conversation (raise_exception)
                raise APIError(400, f"messages: {exc}", param="messages", code="invalid_value") from None
            return req, *prepare(prompt, req, chat=True)

        req, ids, sampling = await loop.prepare(decode)
        want_lp = req.top_n() is not None
        outcome = Outcome()
        stream, pieces = await start(ids, sampling, req.stop, outcome)
        rid, created = S.new_id("chatcmpl"), S.now()

        def logprobs_of(got: list[Piece]) -> dict | None:
            if not want_lp:
                return None
            ids_, lps = [t for p in got for t in p.token_ids], [x for p in got for x in (p.logprobs or ())]
            return chat_entries(tokenizer, ids_, lps)

        if not req.stream:
            got = await collect(request, stream, pieces)
            if outcome.finish_reason == "error":
                raise ended_in_error(outcome)
            return S.ChatCompletionResponse(
                id=rid,
                created=created,
                model=req.model,
                choices=[
                    S.ChatChoice(
                        message=S.ChatMessageOut(content="".join(p.text for p in got)),
                        finish_reason=outcome.finish_reason,
                        logprobs=logprobs_of(got),
                    )
                ],
                usage=usage(len(ids), outcome),
            ).model_dump()

        def chunk(delta: S.ChatDelta, finish: str | None, logprobs: dict | None = None) -> dict:
            out = S.ChatCompletionChunk(
                id=rid,
                created=created,
                model=req.model,
                choices=[S.ChatChunkChoice(delta=delta, finish_reason=finish, logprobs=logprobs)],
            ).model_dump(exclude={"usage"})
            out["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
            return out

        async def events():
            yield chunk(S.ChatDelta(role="assistant", content=""), None)
            async for p in pieces:
                if p.finish_reason == "error":
                    yield stream_error(outcome)
                    return
                yield chunk(S.ChatDelta(content=p.text), p.finish_reason, logprobs_of([p]) if p.logprobs else None)
            if req.stream_options and req.stream_options.include_usage:
                last = chunk(S.ChatDelta(), None)
                last["choices"] = []
                last["usage"] = usage(len(ids), outcome).model_dump()
                yield last

        return sse(stream, events())

    return app
