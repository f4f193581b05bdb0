"""The FastAPI application: OpenAI-compatible completions and chat completions over an `EngineLoop`.

`create_app(engine, tokenizer, config)` builds the `ServerContext` (the engine loop, the metrics: `context.py`),
the middleware (`security.py`) and the error handlers (`errors.py`), and mounts the routes, a router a role:

- `completions.py`: `POST /v1/completions` (with `scoring.py` for `echo` + `logprobs`)
- `chat.py`: `POST /v1/chat/completions`
- `tokenize_api.py`: `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info`
- `status.py`: `GET /health`, `GET /metrics`, `GET /v1/models`

Streams go out as server-sent events (`streaming.py`). The engine thread starts and stops with the app's lifespan.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI

from . import chat, completions, security, status, tokenize_api
from .config import ServerConfig
from .context import ServerContext
from .engine_protocol import ServingEngine
from .errors import install_handlers
from .tokenizer import Tokenizer


def create_app(
    engine: ServingEngine, tokenizer: Tokenizer, config: ServerConfig, served=None, clock=time.monotonic
) -> FastAPI:
    """`served`: a `record.ServeLog` (`serve --record`), written once the engine thread has stopped; `clock`: the
    seconds /health's stall rule reads (tests drive it).

    Request bodies are read incrementally up to `config.max_body_bytes` (413 beyond); parsing, validation and
    tokenisation run in a worker thread, so a large body never blocks the event loop (streams, /health)."""
    ctx = ServerContext.build(engine, tokenizer, config, served, clock)
    app = FastAPI(title="OasisKV", lifespan=_lifespan)
    app.state.context = ctx
    app.state.engine_loop = ctx.loop  # what `lifecycle.GracefulServer` drains
    app.state.metrics = ctx.metrics
    security.install(app, config)
    install_handlers(app)
    for group in (status, completions, tokenize_api, chat):
        app.include_router(group.router)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI):
    ctx: ServerContext = app.state.context
    ctx.loop.start()
    try:
        yield
    finally:
        await ctx.loop.stop()
        if ctx.served is not None:
            ctx.served.write()
