"""What the server says about itself: `GET /health` (the engine's health: 503 with a reason when it is not ok),
`GET /metrics` (Prometheus) and `GET /v1/models` (the served model's card). With `--api-key`, /v1/models needs the
key; /health and /metrics stay open for probes and scrapers."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from . import schemas as S
from .context import context_of
from .metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    status, reason = context_of(request).loop.health()
    if status == "ok":
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": status, "reason": reason}, status_code=503)


@router.get("/metrics")
async def prometheus_metrics(request: Request):
    return Response(context_of(request).metrics.exposition(), media_type=CONTENT_TYPE)


@router.get("/v1/models")
async def models(request: Request):
    ctx = context_of(request)
    info = ctx.info
    card = S.ModelCard(
        id=ctx.model_name,
        created=S.now(),
        max_model_len=info.max_model_len,
        vocab_size=info.vocab_size,
        tokenizer=ctx.tokenizer.describe(),
        dummy=info.dummy,
        mode=info.mode,
        device=info.device,
    )
    return S.ModelList(data=[card]).model_dump()
