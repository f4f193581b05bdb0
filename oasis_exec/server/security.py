"""Who may call the server and how: the API key, the Host allow-list, CORS and the JSON content type.

`install(app, config)` adds, outermost first: starlette's `TrustedHostMiddleware` (`--allowed-hosts`; a request
with another Host header gets a plain 400), FastAPI's `CORSMiddleware` (`--cors-origins`, `--cors-methods`,
`--cors-headers`, `--cors-allow-credentials`; it answers preflight requests itself) and `Guard`: with `--api-key`,
every /v1/* request (and the tokenizer API: /tokenize, /detokenize, /tokenizer_info) needs `Authorization: Bearer KEY` (401 `invalid_api_key` otherwise; /health and /metrics stay
open for probes and scrapers), and a POST to an endpoint that takes a body must send
`Content-Type: application/json` (415 otherwise). `Guard` is plain ASGI, so streams and disconnect detection pass
through it untouched.
"""

from __future__ import annotations

import hmac

from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware

from .config import ServerConfig
from .errors import error_body

JSON_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
KEYED_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")  # beside /v1/*: the tokenizer API (tokenize_api.py)


class Guard:
    def __init__(self, app, *, api_key: str | None) -> None:
        self.app = app
        self._key = None if api_key is None else api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _refusal(self, scope) -> JSONResponse | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        path, method = scope.get("path", ""), scope.get("method", "")
        keyed = path.startswith("/v1/") or path in KEYED_PATHS
        if self._key is not None and keyed and method != "OPTIONS":
            scheme, _, token = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._key):
                return JSONResponse(
                    error_body(
                        401, "missing or wrong API key: send `Authorization: Bearer KEY`", code="invalid_api_key"
                    ),
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        if method == "POST" and path in JSON_ENDPOINTS:
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                shown = media or "none"
                return JSONResponse(
                    error_body(
                        415, f"Content-Type must be application/json, got {shown}", code="unsupported_media_type"
                    ),
                    status_code=415,
                )
        return None


def install(app, config: ServerConfig) -> None:
    app.add_middleware(Guard, api_key=config.api_key)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=list(config.cors_methods),
            allow_headers=list(config.cors_headers),
            allow_credentials=config.cors_allow_credentials,
        )
    if config.allowed_hosts:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(config.allowed_hosts))
