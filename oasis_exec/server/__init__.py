"""OpenAI-compatible HTTP server over the executor engine: `python -m oasis_exec serve` or `python -m
oasis_exec.server`.

    python -m oasis_exec serve --model tiny --dummy --device cpu --port 8000
    curl localhost:8000/v1/completions -d '{"model": "tiny", "prompt": "Hello", "max_tokens": 8, "stream": true}'

Modules: `app` (`create_app`: the FastAPI app assembled), `context` (`ServerContext`: what every route shares),
the routers `completions`, `chat`, `tokenize_api` and `status` (/health, /metrics, /v1/models), `prompts` (a prompt
to token ids and `Sampling`), `streaming` (server-sent events), `scoring` (`echo` + `logprobs`), `config`
(`ServerConfig`, the server's options), `schemas` (pydantic requests and responses), `errors` (OpenAI error
bodies and the app's error handlers), `security` (API key, Host allow-list, CORS, content type),
`engine_protocol` (the engine contract), `adapter` (the executor's engine to that contract), `engine_loop` (the
engine thread, per-request queues, health, draining), `lifecycle` (graceful shutdown), `generation` (stop strings,
pieces), `logprobs` (OpenAI logprob shapes), `tokenizer` (incl. incremental detokenisation), `metrics`
(Prometheus), `cli`. docs/server.md describes the whole.
"""


def add_serve_command(subparsers) -> None:
    """Register `serve` on `python -m oasis_exec`'s subcommands (imports nothing heavy until it runs)."""
    from .adapter import add_engine_args
    from .cli import add_server_args, serve

    p = subparsers.add_parser("serve", help="OpenAI-compatible streaming server (completions, chat, /metrics)")
    add_engine_args(p)
    add_server_args(p)
    p.set_defaults(func=serve)
