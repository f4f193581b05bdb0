"""Server-sent events: a stream of JSON chunks as OpenAI sends them, `data: {...}` each, then `data: [DONE]`.

A failure once the headers are sent is reported in the stream, as an error event before `[DONE]`. When the stream
ends, however it ends (finished, failed, the client gone), the requests behind it are aborted: a no-op for those
that have finished, and what frees the engine's work when the client left.
"""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator

from fastapi.responses import StreamingResponse

from . import schemas as S
from .context import ServerContext
from .engine_loop import RequestStream
from .errors import error_body

log = logging.getLogger("oasis_exec.server")

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(ctx: ServerContext, streams: list[RequestStream | None], events: AsyncIterator[dict]) -> StreamingResponse:
    """The response that sends `events`; `streams`: the engine requests they come from (None: no request ran)."""

    async def body():
        try:
            async for ev in events:
                yield f"data: {json.dumps(ev, separators=(',', ':'))}\n\n"
        except Exception as exc:  # headers are sent: report in-band, as OpenAI does
            log.exception("streaming failed")
            err = error_body(500, f"{type(exc).__name__}: {exc}", code="server_error")
            yield f"data: {json.dumps(err)}\n\n"  # json's default separators, unlike the events
        finally:
            ctx.abort_all(streams)
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers=HEADERS)


def usage_chunk(chunk: dict, usage: S.Usage) -> dict:
    """The last chunk of a stream that asked for usage (`stream_options.include_usage`): no choices, the usage."""
    chunk["choices"] = []
    chunk["usage"] = usage.model_dump()
    return chunk
