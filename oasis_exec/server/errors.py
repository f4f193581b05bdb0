"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from oasis_core.echo import clip

PARAM_LIMIT = 200  # characters of an error's ``param`` (a field path)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """Raised by a handler; rendered by `error_response`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The error object; ``message`` and ``param`` are bounded (``oasis_core.echo.clip``): a request field's name or
    value quoted in them is the client's own text, of any size."""
    return {
        "error": {
            "message": clip(message),
            "type": _TYPE_BY_STATUS.get(status, "invalid_request_error"),
            "param": None if param is None else clip(param, PARAM_LIMIT),
            "code": code,
        }
    }


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def install_handlers(app: FastAPI) -> None:
    """Every error the app answers in this shape: an `APIError`, starlette's 404 / 405, FastAPI's validation."""

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


def _param_of(loc: tuple[Any, ...]) -> str | None:
    """('messages', 0, 'content') -> 'messages[0].content'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or None


def from_validation_error(exc: ValidationError) -> APIError:
    """The first problem of a pydantic validation error, as a 400 naming the field."""
    first = exc.errors(include_url=False)[0]
    kind = first["type"]
    if kind == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {first['msg']}", code="invalid_json")
    if kind == "model_type":
        return APIError(400, "request body must be a JSON object", code="invalid_body")
    param = _param_of(tuple(first["loc"]))
    msg = first["msg"]
    if kind == "missing":
        msg = "field required"
    elif kind == "extra_forbidden":
        msg, kind = "this server does not implement this parameter", "unsupported_parameter"
    elif kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        head, sep, rest = msg.partition(": ")
        if param is None and sep and head.isidentifier():  # a check across fields names the one it refuses
            return APIError(400, msg, param=head, code=kind)
    return APIError(400, f"{param}: {msg}" if param else msg, param=param, code=kind)
