"""--api-key, the Host allow-list, CORS and the JSON content type (in-process server, fake engine)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
import httpx
from server_fakes import FakeEngine, serve_app

from oasis_exec.server.app import create_app
from oasis_exec.server.config import ServerConfig
from oasis_exec.server.tokenizer import ByteTokenizer

BODY = {"model": "fake", "prompt": [1, 2], "max_tokens": 2}


def _serve(**config):
    return serve_app(create_app(FakeEngine(step_s=0), ByteTokenizer(), ServerConfig(**config)))


def test_api_key_is_required_on_v1_only():
    with _serve(api_key="s3cret") as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            r = httpx.post(f"{url}/v1/completions", json=BODY, headers=headers)
            assert r.status_code == 401, headers
            assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{url}/v1/models").status_code == 401
        ok = httpx.post(f"{url}/v1/completions", json=BODY, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**BODY, "stream": True}, headers={"Authorization": "Bearer s3cret"}
        ) as r:
            assert [line for line in r.iter_lines() if line][-1] == "data: [DONE]"
        assert httpx.get(f"{url}/health").status_code == 200  # probes and scrapers need no key
        assert httpx.get(f"{url}/metrics").status_code == 200


def test_host_allow_list():
    with _serve(allowed_hosts=("api.example.com",)) as url:
        assert httpx.get(f"{url}/health", headers={"Host": "evil.example.net"}).status_code == 400
        assert httpx.get(f"{url}/health", headers={"Host": "api.example.com"}).status_code == 200


def test_cors_preflight_and_headers():
    with _serve(cors_origins=("https://app.example.com",), api_key="k") as url:
        pre = httpx.options(
            f"{url}/v1/completions",
            headers={
                "Origin": "https://app.example.com",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example.com"
        r = httpx.post(
            f"{url}/v1/completions",
            json=BODY,
            headers={"Origin": "https://app.example.com", "Authorization": "Bearer k"},
        )
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example.com"
        other = httpx.post(
            f"{url}/v1/completions",
            json=BODY,
            headers={"Origin": "https://evil.example.net", "Authorization": "Bearer k"},
        )
        assert "access-control-allow-origin" not in other.headers
    with _serve() as url:  # no --cors-origins: no CORS headers at all
        r = httpx.get(f"{url}/health", headers={"Origin": "https://app.example.com"})
        assert "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_json_content_type_is_required(content_type):
    with _serve() as url:
        headers = {} if content_type is None else {"Content-Type": content_type}
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = httpx.post(f"{url}{path}", content=b'{"model": "fake", "prompt": "x"}', headers=headers)
            assert r.status_code == 415, r.text
            assert r.json()["error"]["code"] == "unsupported_media_type"
        r = httpx.post(
            f"{url}/v1/completions",
            content=httpx.Request("POST", url, json=BODY).content,
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        assert r.status_code == 200
